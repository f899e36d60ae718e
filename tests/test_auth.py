"""Session authentication (docs/api.md, Authentication and Errors): every bad token is a 401
that reaches nothing.

HTTP tests go through the ASGI app with the HS256 test secret; verifier tests build a
``TokenVerifier`` directly for issuer/audience, PEM public keys and a real JWKS endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import RSAAlgorithm

import app.auth.tokens as tokens_module
from app.auth.tokens import TokenVerifier
from app.errors import ToolgateError, Unauthenticated, Unavailable
from app.outbound import Outbound
from app.settings import ConfigError, Settings
from tests.conftest import SECRET, Providers

PROPOSAL = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
OTHER_SECRET = "another-secret-" + "y" * 32


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**changes: Any) -> dict[str, Any]:
    """Valid claims for the HTTP tests; a change to ``None`` removes that claim."""
    now = int(time.time())
    base: dict[str, Any] = {
        "sub": "alice",
        "tid": "acme",
        "roles": ["support"],
        "iat": now,
        "exp": now + 600,
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def hs256(payload: dict[str, Any], secret: str = SECRET) -> str:
    return jwt.encode(payload, secret, algorithm="HS256")


def unsigned(payload: dict[str, Any], alg: str = "none") -> str:
    header = b64url(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    return f"{header}.{b64url(json.dumps(payload).encode())}."


def hmac_signed(
    payload: dict[str, Any], key: bytes, kid: str | None = None, alg: str = "HS256"
) -> str:
    """An HMAC token built by hand, so that any bytes (even a PEM) can be the secret."""
    head: dict[str, Any] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        head["kid"] = kid
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
    signing_input = f"{b64url(json.dumps(head).encode())}.{b64url(json.dumps(payload).encode())}"
    signature = hmac.new(key, signing_input.encode(), digest).digest()
    return f"{signing_input}.{b64url(signature)}"


def tampered(token: str, payload: dict[str, Any]) -> str:
    """The token with its payload swapped and the original signature kept."""
    header, _, signature = token.split(".")
    return f"{header}.{b64url(json.dumps(payload).encode())}.{signature}"


async def assert_refused_and_nothing_ran(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    providers: Providers,
    authorization: str | None,
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for endpoint in ("/propose", "/execute"):
        response = await client.post(endpoint, json=PROPOSAL, headers=headers)
        assert response.status_code == 401, (endpoint, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["www-authenticate"] == "Bearer"
        body = response.json()
        assert body["code"] == "unauthenticated"
        assert body["type"] == "urn:toolgate:error:unauthenticated"
        assert body["status"] == 401
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert await providers.requests() == []


# --- through the ASGI app (HS256) ----------------------------------------------------------


async def test_the_valid_token_used_as_a_baseline_is_accepted(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """The token factories below differ from these in exactly one respect."""
    for good in (hs256(claims()), hmac_signed(claims(), SECRET.encode())):
        response = await client.post(
            "/propose", json=PROPOSAL, headers={"Authorization": f"Bearer {good}"}
        )
        assert response.status_code == 200, response.text
    assert await db.fetchval("SELECT count(*) FROM calls") == 2


BAD_AUTHORIZATIONS: dict[str, Callable[[], str | None]] = {
    "missing_header": lambda: None,
    "empty_header": lambda: "",
    "bearer_without_token": lambda: "Bearer ",
    "basic_scheme": lambda: "Basic " + b64url(b"alice:secret"),
    "token_scheme_with_a_valid_jwt": lambda: "Token " + hs256(claims()),
    "bare_jwt_without_scheme": lambda: hs256(claims()),
    "malformed_token": lambda: "Bearer not-a-jwt",
    "malformed_three_segments": lambda: "Bearer abc.def.ghi",
    "garbage_header_segment": lambda: "Bearer " + b64url(b"[1,2]") + ".e30.sig",
    "expired": lambda: (
        "Bearer " + hs256(claims(iat=int(time.time()) - 700, exp=int(time.time()) - 60))
    ),
    "wrong_signature": lambda: "Bearer " + hs256(claims(), OTHER_SECRET),
    "tampered_payload": lambda: "Bearer " + tampered(hs256(claims()), claims(tid="globex")),
    "alg_none": lambda: "Bearer " + unsigned(claims()),
    "alg_None_capitalised": lambda: "Bearer " + unsigned(claims(), alg="None"),
    "alg_none_with_the_real_signature": lambda: (
        "Bearer " + unsigned(claims()).rstrip(".") + "." + hs256(claims()).split(".")[2]
    ),
    "disallowed_alg_hs512_with_right_secret": lambda: (
        "Bearer " + hmac_signed(claims(), SECRET.encode(), alg="HS512")
    ),
    "disallowed_alg_hs384_with_right_secret": lambda: (
        "Bearer " + hmac_signed(claims(), SECRET.encode(), alg="HS384")
    ),
    "missing_sub": lambda: "Bearer " + hs256(claims(sub=None)),
    "empty_sub": lambda: "Bearer " + hs256(claims(sub="")),
    "missing_exp": lambda: "Bearer " + hs256(claims(exp=None)),
    "missing_tenant_claim": lambda: "Bearer " + hs256(claims(tid=None)),
    "tenant_claim_not_a_string": lambda: "Bearer " + hs256(claims(tid=42)),
    "empty_tenant_claim": lambda: "Bearer " + hs256(claims(tid="")),
    "nbf_in_the_future": lambda: "Bearer " + hs256(claims(nbf=int(time.time()) + 300)),
    "iat_in_the_future": lambda: "Bearer " + hs256(claims(iat=int(time.time()) + 300)),
    "roles_a_number": lambda: "Bearer " + hs256(claims(roles=7)),
    "roles_an_object": lambda: "Bearer " + hs256(claims(roles={"support": True})),
    "roles_a_list_of_numbers": lambda: "Bearer " + hs256(claims(roles=[1, 2])),
    "nul_in_sub": lambda: "Bearer " + hs256(claims(sub="ali\x00ce")),
    "control_character_in_sub": lambda: "Bearer " + hs256(claims(sub="alice\n")),
    "lone_surrogate_in_sub": lambda: "Bearer " + hs256(claims(sub="alice\ud800")),
    "nul_in_tenant_claim": lambda: "Bearer " + hs256(claims(tid="acme\x00")),
    "c1_control_in_tenant_claim": lambda: "Bearer " + hs256(claims(tid="ac\x85me")),
    "nul_in_a_role": lambda: "Bearer " + hs256(claims(roles=["support\x00"])),
    "empty_role": lambda: "Bearer " + hs256(claims(roles=[""])),
    # the same name in the string form would be read as several roles
    "role_with_a_space_in_a_list": lambda: "Bearer " + hs256(claims(roles=["support admin"])),
    "role_with_a_tab_in_a_list": lambda: "Bearer " + hs256(claims(roles=["support\tadmin"])),
    "role_with_a_no_break_space": lambda: "Bearer " + hs256(claims(roles=["support\u00a0x"])),
    "role_with_an_ideographic_space": lambda: "Bearer " + hs256(claims(roles=["s\u3000x"])),
    "role_ending_in_a_space": lambda: "Bearer " + hs256(claims(roles=["support "])),
    # longer than an index entry can hold, once stored with every call
    "sub_of_2800_characters": lambda: "Bearer " + hs256(claims(sub="a" * 2800)),
    "sub_of_256_characters": lambda: "Bearer " + hs256(claims(sub="é" * 256)),
    "tenant_of_10000_characters": lambda: "Bearer " + hs256(claims(tid="t" * 10_000)),
    "role_of_256_characters": lambda: "Bearer " + hs256(claims(roles=["r" * 256])),
    # NumericDate is a JSON number (RFC 7519); PyJWT reads these through int()
    "exp_a_string": lambda: "Bearer " + hs256(claims(exp=str(int(time.time()) + 600))),
    "exp_true": lambda: "Bearer " + hs256(claims(exp=True, iat=None)),
    "nbf_a_string": lambda: "Bearer " + hs256(claims(nbf=" 0 ")),
    "iat_a_string": lambda: "Bearer " + hs256(claims(iat="0")),
}


@pytest.mark.parametrize("kind", list(BAD_AUTHORIZATIONS))
async def test_a_bad_token_is_401_and_reaches_neither_database_nor_provider(
    kind: str, client: httpx.AsyncClient, db: asyncpg.Connection, providers: Providers
) -> None:
    await assert_refused_and_nothing_ran(client, db, providers, BAD_AUTHORIZATIONS[kind]())


async def test_the_conftest_token_factory_matches_the_configured_claims(
    client: httpx.AsyncClient, token: Callable[..., str], settings: Settings
) -> None:
    """Guard for the baseline: the configured claim names are the ones used above."""
    assert (settings.tenant_claim, settings.roles_claim) == ("tid", "roles")
    decoded = jwt.decode(token(), SECRET, algorithms=["HS256"])
    assert decoded["tid"] == "acme"


# --- the verifier itself ---------------------------------------------------------------------


@pytest.fixture
async def outbound() -> AsyncIterator[Outbound]:
    client = Outbound()
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def refused(verifier: TokenVerifier, token: str) -> ToolgateError:
    with pytest.raises(Unauthenticated) as caught:
        await verifier.verify(token)
    assert caught.value.status == 401
    assert caught.value.code == "unauthenticated"
    return caught.value


ISSUER, AUDIENCE = "https://issuer.example", "toolgate"


async def test_issuer_and_audience_are_enforced_when_configured(outbound: Outbound) -> None:
    settings = Settings.from_env(
        {
            "TOOLGATE_JWT_SECRET": SECRET,
            "TOOLGATE_JWT_ISSUER": ISSUER,
            "TOOLGATE_JWT_AUDIENCE": AUDIENCE,
        }
    )
    verifier = TokenVerifier(settings, outbound)
    await refused(verifier, hs256(claims(aud=AUDIENCE)))  # no iss
    await refused(verifier, hs256(claims(iss="https://evil.example", aud=AUDIENCE)))
    await refused(verifier, hs256(claims(iss=ISSUER)))  # no aud
    await refused(verifier, hs256(claims(iss=ISSUER, aud="someone-else")))
    await refused(verifier, hs256(claims(iss=ISSUER, aud=["someone-else", "another"])))
    principal = await verifier.verify(hs256(claims(iss=ISSUER, aud=AUDIENCE, sid="s1")))
    assert (principal.sub, principal.tenant, principal.roles, principal.session_id) == (
        "alice",
        "acme",
        frozenset({"support"}),
        "s1",
    )
    listed = await verifier.verify(hs256(claims(iss=ISSUER, aud=["other", AUDIENCE])))
    assert listed.sub == "alice"


async def test_issuer_and_audience_are_not_required_when_not_configured(
    outbound: Outbound,
) -> None:
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWT_SECRET": SECRET}), outbound)
    principal = await verifier.verify(hs256(claims(iss="anyone", aud="anything")))
    assert principal.tenant == "acme"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


async def test_a_pem_public_key_verifies_rs256_and_refuses_key_confusion(
    outbound: Outbound, tmp_path: Path
) -> None:
    key = rsa_key()
    pem = public_pem(key)
    pem_file = tmp_path / "issuer.pem"
    pem_file.write_bytes(pem)
    verifier = TokenVerifier(
        Settings.from_env({"TOOLGATE_JWT_PUBLIC_KEY": str(pem_file)}), outbound
    )

    principal = await verifier.verify(jwt.encode(claims(), key, algorithm="RS256"))
    assert (principal.sub, principal.tenant) == ("alice", "acme")

    # The classic attack: HS256 with the public key's PEM text as the HMAC secret.
    await refused(verifier, hmac_signed(claims(), pem))
    await refused(verifier, hmac_signed(claims(), pem.strip()))
    # Signed by some other RSA or EC key.
    await refused(verifier, jwt.encode(claims(), rsa_key(), algorithm="RS256"))
    ec_key = ec.generate_private_key(ec.SECP256R1())
    await refused(verifier, jwt.encode(claims(), ec_key, algorithm="ES256"))
    await refused(verifier, unsigned(claims()))
    # Right key, but an algorithm outside the allow-list.
    await refused(verifier, jwt.encode(claims(), key, algorithm="RS512"))


def test_a_public_key_cannot_be_combined_with_hmac_algorithms(tmp_path: Path) -> None:
    pem_file = tmp_path / "issuer.pem"
    pem_file.write_bytes(public_pem(rsa_key()))
    settings = Settings.from_env(
        {"TOOLGATE_JWT_PUBLIC_KEY": str(pem_file), "TOOLGATE_JWT_ALGORITHMS": "RS256,HS256"}
    )
    with pytest.raises(ConfigError):
        TokenVerifier(settings, Outbound())


@pytest.mark.parametrize(
    ("algorithms", "least"), [("HS256", 32), ("HS384", 48), ("HS256,HS512", 64)]
)
def test_a_secret_shorter_than_its_algorithms_hash_is_refused_at_start(
    algorithms: str, least: int
) -> None:
    """RFC 7518 wants an HMAC key at least as long as the hash: a 32-byte secret does not
    make HS512 any stronger than HS256, and PyJWT warns on every such token."""
    env = {"TOOLGATE_JWT_ALGORITHMS": algorithms}
    with pytest.raises(ConfigError, match=f"at least {least} bytes"):
        TokenVerifier(
            Settings.from_env(env | {"TOOLGATE_JWT_SECRET": "s" * (least - 1)}), Outbound()
        )
    TokenVerifier(Settings.from_env(env | {"TOOLGATE_JWT_SECRET": "s" * least}), Outbound())


@pytest.mark.parametrize(
    ("curve", "algorithms"),
    [(None, "ES256,EdDSA"), (ec.SECP384R1(), None), (ec.SECP256R1(), "ES384")],
)
def test_a_public_key_that_verifies_none_of_the_algorithms_is_refused_at_start(
    tmp_path: Path, curve: ec.EllipticCurve | None, algorithms: str | None
) -> None:
    """An RSA key with only EC algorithms allowed, or a P-384 key with the default list,
    started a service that refused every token, saying only 401."""
    key = rsa_key() if curve is None else ec.generate_private_key(curve)
    pem_file = tmp_path / "issuer.pem"
    pem_file.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    env = {"TOOLGATE_JWT_PUBLIC_KEY": str(pem_file)}
    if algorithms is not None:
        env["TOOLGATE_JWT_ALGORITHMS"] = algorithms
    with pytest.raises(ConfigError, match="TOOLGATE_JWT_ALGORITHMS"):
        TokenVerifier(Settings.from_env(env), Outbound())


class Jwks:
    """A real JWKS endpoint that counts how often it was fetched."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.hits = 0
        self.url = ""
        self.down = False

    def publish(self, kid: str, key: rsa.RSAPrivateKey) -> None:
        jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
        self.keys.append({**jwk, "kid": kid, "alg": "RS256", "use": "sig"})

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.down:
            return web.json_response({"error": "down"}, status=503)
        return web.json_response({"keys": list(self.keys)})


@pytest.fixture
async def jwks() -> AsyncIterator[Jwks]:
    served = Jwks()
    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", served.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    served.url = f"http://127.0.0.1:{port}/.well-known/jwks.json"
    try:
        yield served
    finally:
        await runner.cleanup()


def rs256(key: rsa.RSAPrivateKey, kid: str, **changes: Any) -> str:
    return jwt.encode(claims(**changes), key, algorithm="RS256", headers={"kid": kid})


async def test_jwks_keys_are_cached_and_refetched_once_on_rotation(
    outbound: Outbound, jwks: Jwks, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_a, key_b, key_c = rsa_key(), rsa_key(), rsa_key()
    jwks.publish("A", key_a)
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWKS_URL": jwks.url}), outbound)

    assert (await verifier.verify(rs256(key_a, "A"))).sub == "alice"
    assert jwks.hits == 1
    assert (await verifier.verify(rs256(key_a, "A", sub="bob"))).sub == "bob"
    assert jwks.hits == 1, "a known kid is served from the cache"

    # Rotation: kid B appears. Let the cooldown since the first fetch elapse, so the
    # unknown kid triggers a refetch; many concurrent requests share that one refetch.
    jwks.publish("B", key_b)
    monkeypatch.setattr(tokens_module, "JWKS_REFETCH_COOLDOWN_S", 0.0)
    results = await asyncio.gather(*(verifier.verify(rs256(key_b, "B")) for _ in range(20)))
    assert {p.sub for p in results} == {"alice"}
    assert jwks.hits == 2, "exactly one refetch for the new kid"

    # Inside the cooldown an unknown kid is refused without hitting the issuer again.
    monkeypatch.setattr(tokens_module, "JWKS_REFETCH_COOLDOWN_S", 30.0)
    jwks.publish("C", key_c)
    await refused(verifier, rs256(key_c, "C"))
    await refused(verifier, rs256(key_c, "nobody-knows-me"))
    assert jwks.hits == 2
    # Both published keys keep working from the cache.
    assert (await verifier.verify(rs256(key_a, "A"))).sub == "alice"
    assert (await verifier.verify(rs256(key_b, "B"))).sub == "alice"
    assert jwks.hits == 2


async def test_a_jwks_kid_does_not_vouch_for_another_key_or_algorithm(
    outbound: Outbound, jwks: Jwks
) -> None:
    key_a = rsa_key()
    jwks.publish("A", key_a)
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWKS_URL": jwks.url}), outbound)
    assert (await verifier.verify(rs256(key_a, "A"))).sub == "alice"
    await refused(verifier, rs256(rsa_key(), "A"))  # kid A, signed by someone else
    jwk_json = json.dumps(jwks.keys[0]).encode()
    await refused(verifier, hmac_signed(claims(), jwk_json, kid="A"))
    await refused(verifier, unsigned(claims()))
    assert jwks.hits == 1


async def test_a_remembered_token_stops_working_when_it_expires(
    client: httpx.AsyncClient, providers: Providers
) -> None:
    token = hs256(claims(exp=int(time.time()) + 2))
    headers = {"Authorization": f"Bearer {token}"}
    body = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
    assert (await client.post("/propose", json=body, headers=headers)).status_code == 200
    assert (await client.post("/propose", json=body, headers=headers)).status_code == 200
    await asyncio.sleep(
        max(0.0, jwt.decode(token, SECRET, algorithms=["HS256"])["exp"] - time.time()) + 1.1
    )
    expired = await client.post("/propose", json=body, headers=headers)
    assert (expired.status_code, expired.json()["code"]) == (401, "unauthenticated")


async def test_the_longest_identity_claims_are_accepted_and_stored(
    client: httpx.AsyncClient, db: asyncpg.Connection, clean: None
) -> None:
    sub = "é" * 255
    response = await client.post(
        "/propose",
        json={"tool": "get_order", "arguments": {"order_id": "ord_1"}},
        headers={"Authorization": "Bearer " + hs256(claims(sub=sub))},
    )
    assert response.status_code == 200, response.text
    assert await db.fetchval("SELECT actor FROM calls") == sub


async def test_odd_members_of_a_jwks_are_skipped_and_an_encryption_key_never_verifies(
    outbound: Outbound, jwks: Jwks
) -> None:
    """A key set is read key by key, as RFC 7517 asks: one member this verifier cannot use
    (a ``kid`` that is no string, ``alg`` none or of the wrong type) must not make every
    token a 500, and a key published for encryption (``use: enc``, or ``key_ops`` without
    ``verify``) never vouches for a signature."""
    key_a, key_e, key_w = rsa_key(), rsa_key(), rsa_key()
    jwks.publish("A", key_a)
    jwks.publish("E", key_e)
    jwks.keys[-1]["use"] = "enc"
    jwks.publish("W", key_w)
    jwks.keys[-1].pop("use")
    jwks.keys[-1]["key_ops"] = ["wrapKey"]
    odd = {k: v for k, v in jwks.keys[0].items() if k != "kid"}
    jwks.keys += [
        {**odd, "kid": ["A"]},
        {**odd, "kid": {"A": 1}},
        {**odd, "kid": "N", "alg": "none"},
        {**odd, "kid": "L", "alg": ["RS256"]},
    ]
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWKS_URL": jwks.url}), outbound)
    assert (await verifier.verify(rs256(key_a, "A"))).sub == "alice"
    await refused(verifier, rs256(key_e, "E"))
    await refused(verifier, rs256(key_w, "W"))
    assert jwks.hits == 1


async def test_several_authorization_headers_are_refused_whichever_comes_first(
    client: httpx.AsyncClient, db: asyncpg.Connection, providers: Providers
) -> None:
    """Authorization is a singleton field (RFC 9110): with two, a proxy that checks one and
    toolgate that reads the other would act for different principals."""
    alice, bob = hs256(claims()), hs256(claims(sub="bob"))
    for second in (f"Bearer {bob}", "Bearer not-a-jwt", "Basic " + b64url(b"a:b")):
        for headers in (
            [("Authorization", f"Bearer {alice}"), ("Authorization", second)],
            [("Authorization", second), ("Authorization", f"Bearer {alice}")],
        ):
            response = await client.post("/propose", json=PROPOSAL, headers=headers)
            assert response.status_code == 401, response.text
            assert response.json()["code"] == "unauthenticated"
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert await providers.requests() == []


async def test_jwks_keys_stop_verifying_once_older_than_their_max_age_when_no_refetch_succeeds(
    outbound: Outbound, jwks: Jwks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys are cached for at most ``JWKS_MAX_AGE_S``: a refetch that fails must not renew
    them, or a key the issuer withdrew (or one stolen, while whoever holds it keeps the
    issuer out of reach) verifies for ever, and tokens are told 503, never 401 "unknown
    key", while the issuer's keys cannot be fetched."""
    key_a = rsa_key()
    jwks.publish("A", key_a)
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWKS_URL": jwks.url}), outbound)
    assert (await verifier.verify(rs256(key_a, "A"))).sub == "alice"
    jwks.down = True
    monkeypatch.setattr(tokens_module, "JWKS_MAX_AGE_S", 0.2)
    monkeypatch.setattr(tokens_module, "JWKS_REFETCH_COOLDOWN_S", 0.1)
    await asyncio.sleep(0.3)
    for sub in ("bob", "carol", "dave"):  # distinct tokens: none answered from memory
        with pytest.raises(Unavailable):
            await verifier.verify(rs256(key_a, "A", sub=sub))
        monkeypatch.setattr(tokens_module, "JWKS_REFETCH_COOLDOWN_S", 30.0)
    assert jwks.hits == 2, "one refetch per cooldown while the issuer is down"
    jwks.down = False
    monkeypatch.setattr(tokens_module, "JWKS_REFETCH_COOLDOWN_S", 0.0)
    assert (await verifier.verify(rs256(key_a, "A", sub="erin"))).sub == "erin"
    assert jwks.hits == 3


async def test_a_jwks_that_cannot_be_fetched_at_first_is_503_not_an_unknown_key(
    outbound: Outbound, jwks: Jwks
) -> None:
    key_a = rsa_key()
    jwks.publish("A", key_a)
    jwks.down = True
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWKS_URL": jwks.url}), outbound)
    for sub in ("alice", "bob"):
        with pytest.raises(Unavailable):
            await verifier.verify(rs256(key_a, "A", sub=sub))
    assert jwks.hits == 1


@pytest.mark.parametrize(
    "url",
    [
        "https://issuer.example/.well-known/jwks.json",
        "http://127.0.0.1:8400/jwks.json",
        "http://127.9.0.1/jwks.json",
        "http://[::1]:8400/jwks.json",
        "http://localhost:8400/jwks.json",
    ],
)
def test_a_jwks_url_is_https_or_on_this_machine(url: str) -> None:
    """Plain http stays possible for an issuer on this machine (a local trial, a sidecar);
    ``test_serve_refuses_a_jwks_url_it_could_never_fetch`` has those refused."""
    assert Settings.from_env({"TOOLGATE_JWKS_URL": url}).jwks_url == url


OIDC = {
    "TOOLGATE_JWKS_URL": "https://login.example/jwks",
    "TOOLGATE_OIDC_ISSUER": "https://login.example",
    "TOOLGATE_OIDC_CLIENT_ID": "toolgate-console",
}


def test_console_sign_in_verifies_the_issuers_tokens_for_the_console() -> None:
    settings = Settings.from_env(OIDC)
    assert (settings.jwt_issuer, settings.jwt_audience) == (
        "https://login.example",
        "toolgate-console",
    )
    api = Settings.from_env({**OIDC, "TOOLGATE_JWT_AUDIENCE": "https://api.example"})
    assert api.jwt_audience == "https://api.example"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"TOOLGATE_OIDC_CLIENT_ID": ""}, "both TOOLGATE_OIDC_ISSUER and"),
        ({"TOOLGATE_JWKS_URL": ""}, "needs TOOLGATE_JWKS_URL"),
        ({"TOOLGATE_OIDC_ISSUER": "http://login.example"}, "must be an https:// URL"),
        ({"TOOLGATE_OIDC_ISSUER": "https://login.example/?x=1"}, "without query"),
        ({"TOOLGATE_JWT_ISSUER": "https://other.example"}, "differs from TOOLGATE_OIDC_ISSUER"),
        ({"TOOLGATE_OIDC_CLIENT_ID": "a\tb"}, "printable ASCII"),
        ({"TOOLGATE_OIDC_ISSUER": "https://login.example/\x00"}, "printable ASCII"),
        ({"TOOLGATE_OIDC_ISSUER": "https://lögin.example"}, "printable ASCII"),
    ],
)
def test_console_sign_in_is_refused_unless_it_can_be_verified(
    changes: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({**OIDC, **changes})


@pytest.mark.parametrize(
    "roles",
    [
        ["support", "finance_approver"],
        "support finance_approver",
        " support\tfinance_approver\n",
        "support\u00a0finance_approver",
    ],
)
async def test_a_list_of_roles_and_a_space_separated_string_are_read_alike(
    outbound: Outbound, roles: Any
) -> None:
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWT_SECRET": SECRET}), outbound)
    principal = await verifier.verify(hs256(claims(roles=roles)))
    assert principal.roles == frozenset({"support", "finance_approver"})


async def test_a_listed_role_name_holding_whitespace_is_refused_not_read_as_one_role(
    outbound: Outbound,
) -> None:
    """``["support finance_approver"]`` would be one role, and the same words as a string
    two: a name that the claim's two forms would read differently is refused."""
    verifier = TokenVerifier(Settings.from_env({"TOOLGATE_JWT_SECRET": SECRET}), outbound)
    caught = await refused(verifier, hs256(claims(roles=["support finance_approver"])))
    assert caught.detail == "token claims are malformed"
