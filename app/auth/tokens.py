"""Verifying session tokens with PyJWT: pinned algorithms, required claims, cached keys.

The algorithm allow-list comes from configuration, never from the token; ``none`` can never
be in it. JWKS keys are cached by ``kid`` and refetched (at most once per cooldown) when an
unknown ``kid`` appears, over the non-blocking outbound client.
"""

from __future__ import annotations

import asyncio
import time
import unicodedata
from typing import Any, TypeGuard

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from app.auth.principal import Principal
from app.errors import Unauthenticated, Unavailable
from app.outbound import NotSent, Outbound, Uncertain
from app.settings import ConfigError, Settings

JWKS_REFETCH_COOLDOWN_S = 30.0
JWKS_MAX_AGE_S = 300.0
VERIFIED_TTL_S = 60.0
VERIFIED_MAX = 4096
JWKS_TIMEOUT_S = 5.0


class JwksCache:
    def __init__(self, url: str, outbound: Outbound) -> None:
        self._url = url
        self._outbound = outbound
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at = float("-inf")  # the last fetch tried
        self._keys_at = float("-inf")  # the last one that gave ``_keys``
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None) -> jwt.PyJWK:
        """The key for ``kid``. Keys older than ``JWKS_MAX_AGE_S`` are refetched first, so a
        key the issuer withdrew stops verifying; only a fetch that succeeds renews them, so
        while the issuer is out of reach tokens are ``Unavailable``, not verified with old
        keys for ever. An unknown ``kid``, or stale keys, trigger at most one fetch per
        cooldown."""
        key = self._lookup(kid) if not self._stale() else None
        if key is not None:
            return key
        async with self._lock:
            if self._stale():
                if not self._may_fetch():
                    raise Unavailable("the token issuer's keys cannot be fetched")
                await self._refresh()
            key = self._lookup(kid)
            if key is None and self._may_fetch():
                await self._refresh()
                key = self._lookup(kid)
        if key is None:
            raise Unauthenticated("token signed with an unknown key")
        return key

    def _stale(self) -> bool:
        return time.monotonic() - self._keys_at >= JWKS_MAX_AGE_S

    def _may_fetch(self) -> bool:
        return time.monotonic() - self._fetched_at >= JWKS_REFETCH_COOLDOWN_S

    def _lookup(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid)

    async def _refresh(self) -> None:
        self._fetched_at = time.monotonic()
        try:
            response = await self._outbound.request("GET", self._url, timeout_s=JWKS_TIMEOUT_S)
        except (NotSent, Uncertain) as exc:
            raise Unavailable("the token issuer's keys cannot be fetched") from exc
        if response.status != 200 or not isinstance(response.body, dict):
            raise Unavailable("the token issuer's keys cannot be fetched")
        keys = _signature_keys(response.body.get("keys"))
        if not keys:
            raise Unavailable("the token issuer's key set is unusable")
        self._keys, self._keys_at = keys, self._fetched_at


def _signature_keys(members: Any) -> dict[str | None, jwt.PyJWK]:
    """The members of a JWKS that verify signatures, by ``kid``. Read one by one, as RFC 7517
    asks: PyJWT's ``PyJWKSet`` lets a member whose ``kid`` or ``alg`` it cannot handle (a
    list, ``none``) raise past it, which made every token a 500, and it keeps keys the issuer
    published for encryption (``use``) or for other operations (``key_ops``) only, which
    must never vouch for a token."""
    keys: dict[str | None, jwt.PyJWK] = {}
    for data in members if isinstance(members, list) else ():
        if not isinstance(data, dict) or data.get("use", "sig") != "sig":
            continue
        kid, alg, ops = data.get("kid"), data.get("alg"), data.get("key_ops", ["verify"])
        if not (kid is None or isinstance(kid, str)) or not (alg is None or isinstance(alg, str)):
            continue
        if alg == "none" or not isinstance(ops, list) or "verify" not in ops:
            continue
        try:
            keys[kid] = jwt.PyJWK(data)
        except jwt.PyJWTError:
            continue
    return keys


class TokenVerifier:
    def __init__(self, settings: Settings, outbound: Outbound) -> None:
        settings.check_keys()
        self._settings = settings
        self._algorithms = list(settings.jwt_algorithms)
        self._jwks = JwksCache(settings.jwks_url, outbound) if settings.jwks_url else None
        self._verified: dict[str, tuple[Principal, float]] = {}
        self._static_key: Any = settings.jwt_secret
        if settings.jwt_public_key_file is not None:
            try:
                self._static_key = load_pem_public_key(settings.jwt_public_key_file.read_bytes())
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"TOOLGATE_JWT_PUBLIC_KEY is not a PEM public key: {exc}"
                ) from None
            if not any(_fits(a, self._static_key) for a in self._algorithms):
                raise ConfigError(
                    f"TOOLGATE_JWT_PUBLIC_KEY ({type(self._static_key).__name__}) verifies none"
                    f" of TOOLGATE_JWT_ALGORITHMS ({', '.join(self._algorithms)}): every token"
                    " would be refused"
                )

    async def verify(self, token: str) -> Principal:
        """The token's principal. A token verified in the last ``VERIFIED_TTL_S`` (and not
        expired since) is answered from memory: an agent sends the same session token with
        every call, and signature checks were a tenth of a request's CPU."""
        now = time.time()
        cached = self._verified.get(token)
        if cached is not None and now < cached[1]:
            return cached[0]
        principal, expires = await self._verify(token)
        if len(self._verified) >= VERIFIED_MAX:
            self._verified.pop(next(iter(self._verified)))
        self._verified[token] = (principal, min(expires, now + VERIFIED_TTL_S))
        return principal

    async def _verify(self, token: str) -> tuple[Principal, float]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("malformed token") from None
        algorithm = header.get("alg")
        if algorithm not in self._algorithms:
            raise Unauthenticated("token algorithm not allowed")
        key = self._static_key
        if self._jwks is not None:
            jwk = await self._jwks.key(header.get("kid"))
            if jwk.algorithm_name != algorithm:
                raise Unauthenticated("token algorithm does not match its key")
            key = jwk.key
        s = self._settings
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                issuer=s.jwt_issuer,
                audience=s.jwt_audience,
                options={
                    "require": ["sub", "exp", s.tenant_claim]
                    + (["iss"] if s.jwt_issuer else [])
                    + (["aud"] if s.jwt_audience else []),
                    "verify_aud": s.jwt_audience is not None,
                },
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("token expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("token not yet valid") from None
        except (jwt.PyJWTError, ValueError, TypeError):
            raise Unauthenticated("invalid token") from None
        if not all(_numeric_date(claims[name]) for name in TIME_CLAIMS if name in claims):
            raise Unauthenticated("invalid token")
        return self._principal(claims), float(claims["exp"])

    def _principal(self, claims: dict[str, Any]) -> Principal:
        sub, tenant = claims.get("sub"), claims.get(self._settings.tenant_claim)
        roles = claims.get(self._settings.roles_claim, [])
        if isinstance(roles, str):
            roles = roles.split()
        if (
            not identifier(sub)
            or not identifier(tenant)
            or not isinstance(roles, list)
            or not all(role_name(r) for r in roles)
        ):
            raise Unauthenticated("token claims are malformed")
        sid = claims.get("sid")
        return Principal(sub, tenant, frozenset(roles), sid if identifier(sid) else None)


def _fits(algorithm: str, key: Any) -> bool:
    """Whether ``algorithm`` can verify with ``key`` (its type, and an EC key's curve).
    PyJWT says no with ``InvalidKeyError``, or (EdDSA) ``TypeError``."""
    try:
        jwt.get_algorithm_by_name(algorithm).prepare_key(key)
    except (jwt.PyJWTError, TypeError, ValueError):
        return False
    return True


TIME_CLAIMS = ("exp", "nbf", "iat")


def _numeric_date(claim: Any) -> bool:
    """A JSON number, as RFC 7519 says a time claim is: PyJWT compares them through
    ``int()``, which also takes a string (``"9999999999"``) or a boolean."""
    return isinstance(claim, int | float) and not isinstance(claim, bool)


MAX_IDENTIFIER = 255
"""Characters in a ``sub``, tenant, role or ``sid`` (OpenID Connect's bound on ``sub``): who
made a call is stored in indexed columns, and an index entry holds at most about 8 kB."""


def identifier(claim: Any) -> TypeGuard[str]:
    """A claim fit to name someone: a non-empty string of at most ``MAX_IDENTIFIER``
    characters without control characters or lone surrogates. Identity is stored with every
    decision and compared everywhere; a NUL or a control character in it could be neither
    stored nor shown safely, and a longer one not stored in an index."""
    if not isinstance(claim, str) or not claim or len(claim) > MAX_IDENTIFIER:
        return False
    if claim.isascii():
        return claim.isprintable()
    return not any(unicodedata.category(c) in ("Cc", "Cs") for c in claim)


def role_name(claim: Any) -> TypeGuard[str]:
    """An ``identifier`` without whitespace: the roles claim may be one space-separated
    string, which is split on whitespace, so ``"support finance_approver"`` inside a list
    would be one role here and two in the string form. A name no form can carry is refused
    rather than read one way or the other."""
    return identifier(claim) and not any(c.isspace() for c in claim)


def split_roles(text: str) -> list[str]:
    """Role names written as people write lists, separated by commas, whitespace, or both
    (``"support, finance_approver"``, ``"support finance_approver"``): each the name the
    verifier would read from the same words in a space-separated roles claim."""
    return text.replace(",", " ").split()


def mint(settings: Settings, sub: str, tenant: str, roles: list[str], ttl_s: int) -> str:
    """A token signed with the configured secret, for local trials (``toolgate token``):
    HS256, or the first allowed algorithm when the allow-list leaves HS256 out."""
    if not settings.jwt_secret:
        raise ConfigError("toolgate token needs TOOLGATE_JWT_SECRET")
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": sub,
        settings.tenant_claim: tenant,
        settings.roles_claim: roles,
        "iat": now,
        "exp": now + ttl_s,
    }
    if settings.jwt_issuer:
        claims["iss"] = settings.jwt_issuer
    if settings.jwt_audience:
        claims["aud"] = settings.jwt_audience
    allowed = settings.jwt_algorithms
    algorithm = "HS256" if "HS256" in allowed else allowed[0]
    return jwt.encode(claims, settings.jwt_secret, algorithm=algorithm)
