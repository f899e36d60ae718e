"""The ``toolgate`` command as a real subprocess with a controlled environment
(docs/configuration.md).

``python -m app.cli`` runs from the repository root so the checkout under test is the one
imported. Every subprocess has a timeout; ``serve`` must refuse bad configurations on its
own, quickly, without ever listening.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import pytest

from app import demo
from app.auth.tokens import TokenVerifier
from app.db import migration_files
from app.demo import DEMO_SECRET
from app.outbound import Outbound
from app.settings import Settings
from tests.catalogs import BASE, write
from tests.conftest import ROOT, SECRET, free_port, with_database

SERVE_TIMEOUT_S = 20


def base_env(**variables: str) -> dict[str, str]:
    """No inherited TOOLGATE_* variables: only what the test sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLGATE_", "DEMO_"))}
    return {**env, **variables}


def toolgate(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def run(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(toolgate, *args, env=env, timeout=timeout)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- check ------------------------------------------------------------------------------------


async def test_check_accepts_the_shipped_catalog() -> None:
    result = await run("check", "catalog/", env=base_env())
    assert result.returncode == 0, result.stderr
    assert "policy_version demo-2026-11-29#" in result.stdout
    assert "warning" not in result.stderr  # the demo states no rule it does not keep


async def test_check_prints_warnings_and_still_accepts_the_catalog(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.replace("approvers: [actor,", "approvers: [owner,"))
    result = await run("check", str(path), env=base_env())
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, result.stderr
    assert "write 'actor'" in warnings[0]
    assert "their own high-impact call" in warnings[1]


async def test_check_prints_every_problem_with_file_and_line(tmp_path: Path) -> None:
    text = BASE
    for old, new in (
        (
            "    mutation: false\n    provider: billing\n",
            "    mutation: false\n    provider: ups\n",
        ),
        ('high_impact_when: "args.amount > 100.0"', 'high_impact_when: "request.amount > 1"'),
        ("    dry_run: {method: POST, path: /refunds/preview}\n", ""),
    ):
        assert text.count(old) == 1
        text = text.replace(old, new)
    path = write(tmp_path, text)
    lines = text.splitlines()
    expected = [
        lines.index("    provider: ups") + 1,
        lines.index('    high_impact_when: "request.amount > 1"') + 1,
        lines.index("    require_dry_run: true") + 1,
    ]
    for args, env in (
        (("check", str(path)), base_env()),
        (("check",), base_env(TOOLGATE_CATALOG=str(path))),
        (("--catalog", str(path), "check"), base_env()),
    ):
        result = await run(*args, env=env)
        assert result.returncode != 0, args
        output = result.stdout + result.stderr
        for line in expected:
            assert f"{path}:{line}: " in output, (args, line, output)
        assert "Traceback" not in output


async def test_check_prints_a_trusted_field_the_result_cannot_have_and_a_trusted_write(
    tmp_path: Path,
) -> None:
    note = "        note: {type: string, maxLength: 500, x-sensitive: true}\n"
    text = BASE.replace(
        "    result: {fields: [id, status]}\n",
        "    result: {fields: [id, status], trusted: [total]}\n",
    ).replace(note, note + "    result: {trusted: true}\n")
    path = write(tmp_path, text)
    lines = text.splitlines()
    result = await run("check", str(path), env=base_env())
    assert result.returncode != 0
    output = result.stdout + result.stderr
    get_order = lines.index("    result: {fields: [id, status], trusted: [total]}") + 1
    refund = lines.index("    result: {trusted: true}") + 1
    assert (
        f"{path}:{get_order}: tools.get_order.result.trusted.0: 'total' is not within a kept"
        " field (result.fields): the result never has it"
    ) in output
    assert (
        f"{path}:{refund}: tools.issue_refund.result.trusted: a write vouches for nothing:"
        " only a read's result is trusted"
    ) in output


async def test_check_of_a_missing_path_fails(tmp_path: Path) -> None:
    result = await run("check", str(tmp_path / "nope.yaml"), env=base_env())
    assert result.returncode != 0
    assert "nope.yaml" in result.stdout + result.stderr


async def test_a_catalog_path_that_cannot_be_looked_at_is_a_problem_not_a_traceback(
    database_url: str, tmp_path: Path
) -> None:
    """A path the system refuses to look up (a name over 255 bytes; for another user, a
    directory without search permission) raised OSError out of the loader: check and serve
    ended with a traceback instead of the problem."""
    path = tmp_path / ("c" * 300)
    result = await run("check", str(path), env=base_env())
    assert result.returncode == 1, result.stderr
    assert f"{path}: unreadable: File name too long" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    env = base_env(
        TOOLGATE_DATABASE_URL=database_url, TOOLGATE_JWT_SECRET=SECRET, TOOLGATE_CATALOG=str(path)
    )
    await refuses_to_serve(env, "invalid catalog", "File name too long")


# --- token ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ttl", "expected_ttl"), [(None, 3600), ("120", 120)])
async def test_token_mints_a_verifiable_hs256_token(ttl: str | None, expected_ttl: int) -> None:
    args = ["token", "--sub", "a", "--tenant", "t", "--roles", "x,y"]
    if ttl is not None:
        args += ["--ttl", ttl]
    before = time.time()
    result = await run(*args, env=base_env(TOOLGATE_JWT_SECRET=SECRET))
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert (claims["sub"], claims["tid"], claims["roles"]) == ("a", "t", ["x", "y"])
    assert before + expected_ttl - 5 <= claims["exp"] <= time.time() + expected_ttl + 5
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, "x" * 40, algorithms=["HS256"])


@pytest.mark.parametrize(
    "args",
    [
        ("--ttl", "0"),
        ("--ttl", "-5"),
        ("--ttl", "999999999999999999999999"),
        ("--sub", ""),
        ("--tenant", "acme\x1b[2J"),
        ("--roles", "support,r\x07"),
        ("--sub", "a" * 256),
    ],
)
async def test_token_refuses_what_would_mint_a_token_toolgate_refuses(
    args: tuple[str, str],
) -> None:
    """These printed a token and exited 0: already expired, or with a claim the verifier
    refuses, so the trial failed later with a bare 401."""
    options = {"--sub": "a", "--tenant": "t", **dict([args])}
    argv = [part for pair in options.items() for part in pair]
    result = await run("token", *argv, env=base_env(TOOLGATE_JWT_SECRET=SECRET))
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    assert args[0] in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "roles",
    [
        " support , finance_approver ,",
        "support finance_approver",
        "support,finance_approver",
        "support, finance_approver",
        "  support\tfinance_approver  ",
        ",,support,,, finance_approver",
    ],
)
async def test_token_roles_are_separated_by_commas_or_whitespace_alike(roles: str) -> None:
    """``--roles "support finance_approver"`` minted one role whose name held a space,
    though a roles claim written as a string is split on whitespace: either separator, or
    both, now gives the same two roles, which the server reads as they were meant."""
    args = ("token", "--sub", "a", "--tenant", "t", "--roles", roles)
    env = base_env(TOOLGATE_JWT_SECRET=SECRET)
    result = await run(*args, env=env)
    assert result.returncode == 0, result.stderr
    claims = jwt.decode(result.stdout.strip(), SECRET, algorithms=["HS256"])
    assert claims["roles"] == ["support", "finance_approver"]
    principal = await TokenVerifier(Settings.from_env(env), Outbound()).verify(
        result.stdout.strip()
    )
    assert principal.roles == frozenset({"support", "finance_approver"})


async def test_token_help_says_how_roles_are_separated() -> None:
    result = await run("token", "--help", env=base_env())
    assert result.returncode == 0, result.stderr
    assert "commas and/or whitespace" in " ".join(result.stdout.split())


async def test_token_without_any_key_signs_with_the_demo_secret_and_says_so() -> None:
    result = await run("token", "--sub", "a", "--tenant", "t", env=base_env())
    assert result.returncode == 0, result.stderr
    assert "TOOLGATE_JWT_SECRET is not set; signed with the demo secret" in result.stderr
    claims = jwt.decode(result.stdout.strip(), DEMO_SECRET, algorithms=["HS256"])
    assert (claims["sub"], claims["tid"]) == ("a", "t")


@pytest.mark.parametrize("algorithms", ["HS512", "HS384,HS512"])
async def test_token_is_one_the_configured_server_accepts(algorithms: str) -> None:
    """With TOOLGATE_JWT_ALGORITHMS naming HS384/HS512 only, token printed an HS256 token
    that the server, given the same environment, answered with a bare 401."""
    env = base_env(
        TOOLGATE_JWT_SECRET=secrets.token_hex(32),  # as long as an HS512 key should be
        TOOLGATE_JWT_ALGORITHMS=algorithms,
        TOOLGATE_JWT_ISSUER="https://issuer.example",
        TOOLGATE_TENANT_CLAIM="org",
    )
    result = await run("token", "--sub", "a", "--tenant", "t", "--roles", "x", env=env)
    assert result.returncode == 0, result.stderr
    verifier = TokenVerifier(Settings.from_env(env), Outbound())
    principal = await verifier.verify(result.stdout.strip())
    assert (principal.sub, principal.tenant, principal.roles) == ("a", "t", frozenset({"x"}))


@pytest.mark.parametrize(
    "variables",
    [
        {"TOOLGATE_JWT_SECRET": "too-short"},
        {"TOOLGATE_JWT_SECRET": SECRET, "TOOLGATE_JWT_ALGORITHMS": "HS999"},
        {"TOOLGATE_JWT_SECRET": SECRET, "TOOLGATE_JWKS_URL": "https://issuer.example/jwks"},
    ],
)
async def test_token_refuses_a_key_configuration_serve_refuses(variables: dict[str, str]) -> None:
    """These printed a token (or a NotImplementedError traceback) that no server started
    with the same environment could ever accept: serve refuses to start on them."""
    result = await run("token", "--sub", "a", "--tenant", "t", env=base_env(**variables))
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    assert result.stderr.startswith("toolgate: "), result.stderr
    assert "Traceback" not in result.stderr


async def test_token_with_only_a_public_key_configured_fails_clearly(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not used")
    env = base_env(TOOLGATE_JWT_PUBLIC_KEY=str(key))
    result = await run("token", "--sub", "a", "--tenant", "t", env=env)
    assert result.returncode != 0
    assert "TOOLGATE_JWT_SECRET" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("host", "secret"), [("0.0.0.0", None), ("::", None), ("192.0.2.7", DEMO_SECRET)]
)
async def test_demo_refuses_the_published_secret_beyond_this_machine(
    database_url: str, host: str, secret: str | None
) -> None:
    """With the published demo secret anyone who can reach the port mints a token for any
    user, tenant and role (admin included): on an address other machines reach, that is a
    service open to all, with the database it was given."""
    port, providers = free_port(), free_port()
    env = base_env(
        TOOLGATE_DATABASE_URL=database_url, DEMO_PROVIDERS_URL=f"http://127.0.0.1:{providers}"
    )
    if secret is not None:
        env["TOOLGATE_JWT_SECRET"] = secret
    result = await run("demo", "--host", host, "--port", str(port), env=env, timeout=20)
    assert result.returncode == 2, result.stderr
    assert "TOOLGATE_JWT_SECRET" in result.stderr, result.stderr
    assert host in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not listening(port)
    assert not listening(providers)


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc", "http://[::1", "http://127.0.0.1:99999"])
async def test_demo_refuses_a_malformed_providers_url_clearly(database_url: str, url: str) -> None:
    """A DEMO_PROVIDERS_URL whose port or host urllib cannot read ended the demo with a
    ValueError traceback (exit status 1)."""
    port = free_port()
    env = base_env(TOOLGATE_DATABASE_URL=database_url, DEMO_PROVIDERS_URL=url)
    result = await run("demo", "--port", str(port), env=env, timeout=20)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("toolgate: DEMO_PROVIDERS_URL"), result.stderr
    assert "Traceback" not in result.stderr
    assert not listening(port)


# --- serve refuses to start -------------------------------------------------------------------


async def refuses_to_serve(env: dict[str, str], *messages: str) -> str:
    port = free_port()
    started = time.monotonic()
    result = await run("serve", "--port", str(port), env=env, timeout=SERVE_TIMEOUT_S)
    assert time.monotonic() - started < SERVE_TIMEOUT_S
    assert result.returncode != 0, result.stdout + result.stderr
    assert not listening(port)
    assert "Uvicorn running" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for message in messages:
        assert message in result.stderr, result.stderr
    return result.stderr


def serve_env(database_url: str | None, **variables: str) -> dict[str, str]:
    env = {"TOOLGATE_CATALOG": str(ROOT / "catalog"), "TOOLGATE_JWT_SECRET": SECRET}
    if database_url is not None:
        env["TOOLGATE_DATABASE_URL"] = database_url
    return base_env(**{**env, **variables})


async def test_serve_refuses_without_any_key(database_url: str) -> None:
    env = serve_env(database_url)
    del env["TOOLGATE_JWT_SECRET"]
    await refuses_to_serve(env, "TOOLGATE_JWT_SECRET", "TOOLGATE_JWKS_URL")


async def test_serve_refuses_a_short_secret(database_url: str) -> None:
    await refuses_to_serve(
        serve_env(database_url, TOOLGATE_JWT_SECRET="s" * 31), "TOOLGATE_JWT_SECRET", "32"
    )


@pytest.mark.parametrize("algorithms", ["HS999", "HS256,hs512"])
async def test_serve_refuses_an_algorithm_it_does_not_know(
    database_url: str, algorithms: str
) -> None:
    """Such a list verified no token at all: every call was refused, and nothing said why."""
    env = serve_env(database_url, TOOLGATE_JWT_ALGORITHMS=algorithms)
    await refuses_to_serve(env, "TOOLGATE_JWT_ALGORITHMS", "unknown algorithm")


@pytest.mark.parametrize(
    ("variable", "where"),
    [
        ("TOOLGATE_AUDIT_ARCHIVE_DIR", "missing"),
        ("TOOLGATE_AUDIT_ARCHIVE_DIR", "a_file"),
        ("TOOLGATE_AUDIT_CHECKPOINT_FILE", "missing/checkpoints.jsonl"),
        ("TOOLGATE_AUDIT_CHECKPOINT_FILE", "a_dir"),
        # Names the system refuses to look up at all (as a directory toolgate may not
        # search): an OSError traceback, exit status 1.
        ("TOOLGATE_AUDIT_ARCHIVE_DIR", "n" * 300),
        ("TOOLGATE_AUDIT_CHECKPOINT_FILE", "n" * 300),
        ("TOOLGATE_AUDIT_CHECKPOINT_FILE", "n" * 300 + "/checkpoints.jsonl"),
        ("TOOLGATE_JWT_PUBLIC_KEY", "n" * 300),
    ],
)
async def test_serve_refuses_an_audit_path_it_cannot_write(
    database_url: str, tmp_path: Path, variable: str, where: str
) -> None:
    """Such a start looked fine; then no month was ever archived and removed, or no
    checkpoint written, with an error in the log at every pass."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "a_dir").mkdir()
    env = serve_env(database_url, **{variable: str(tmp_path / where)})
    if variable == "TOOLGATE_JWT_PUBLIC_KEY":
        del env["TOOLGATE_JWT_SECRET"]
    stderr = await refuses_to_serve(env, variable)
    assert "toolgate: " in stderr, stderr


async def test_serve_refuses_both_a_secret_and_a_jwks_url(database_url: str) -> None:
    env = serve_env(database_url, TOOLGATE_JWKS_URL="http://127.0.0.1:9/jwks.json")
    await refuses_to_serve(env, "exactly one")


@pytest.mark.parametrize("ttl", ["0", "-5", "1e3", "\u00b2", "300000000000"])
async def test_serve_refuses_an_idempotency_ttl_that_is_not_a_usable_number_of_seconds(
    database_url: str, ttl: str
) -> None:
    """A superscript digit passes ``str.isdigit`` but not ``int``; a TTL past the year 9999
    cannot be added to now, which failed every mutation with a 500 instead of the start."""
    env = serve_env(database_url, TOOLGATE_IDEMPOTENCY_TTL_S=ttl)
    await refuses_to_serve(env, "TOOLGATE_IDEMPOTENCY_TTL_S")


@pytest.mark.parametrize("variable", ["TOOLGATE_JWT_SECRET", "TOOLGATE_DATABASE_URL"])
async def test_serve_refuses_a_value_that_is_not_utf8(database_url: str, variable: str) -> None:
    """The byte 0xff reaches Python as a lone surrogate, which no encoder takes: the
    secret's length check and asyncpg both crashed with a traceback."""
    env = serve_env(database_url)
    env[variable] = "\udcff" + env[variable]
    await refuses_to_serve(env, variable, "UTF-8")


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("TOOLGATE_DATABASE_URL", "postgresql://127.0.0.1:99999/toolgate"),
        ("TOOLGATE_DATABASE_URL", "postgresql://[bad/toolgate"),
        ("TOOLGATE_REDIS_URL", "redis://127.0.0.1:99999/0"),
        ("TOOLGATE_REDIS_URL", "http://127.0.0.1:6379/0"),
    ],
)
async def test_serve_refuses_a_malformed_database_or_redis_url(
    database_url: str, variable: str, url: str
) -> None:
    """These crashed serve with a ValueError traceback (from the URL parser, or redis-py)."""
    await refuses_to_serve(serve_env(database_url, **{variable: url}), variable)


@pytest.mark.parametrize(
    "url",
    [
        "issuer.example/.well-known/jwks.json",
        "ftp://issuer.example/jwks.json",
        "https:///jwks.json",
        "https://issuer.example:99999/jwks.json",
        "http://issuer.example/jwks.json",
        "http://10.0.0.7/jwks.json",
        "http://localhost.issuer.example/jwks.json",
        "http://127.0.0.1.nip.io/jwks.json",
    ],
)
async def test_serve_refuses_a_jwks_url_it_could_never_fetch(database_url: str, url: str) -> None:
    """Such a URL started a service that answered every request 503: the key was as
    missing as no key at all, which serve refuses. Plain http to another machine was
    accepted: anyone on the way could answer with keys of their own and sign any token."""
    env = serve_env(database_url, TOOLGATE_JWKS_URL=url)
    del env["TOOLGATE_JWT_SECRET"]
    await refuses_to_serve(env, "TOOLGATE_JWKS_URL")


@pytest.mark.parametrize(
    "args", [("--port", "99999"), ("--port", "-1"), ("--workers", "0"), ("--workers", "-3")]
)
async def test_serve_refuses_a_port_or_worker_count_out_of_range(
    database_url: str, args: tuple[str, str]
) -> None:
    """--port 99999 listened on 34463 (99999 mod 65536) while logging 99999; no workers
    started one anyway."""
    result = await run("serve", *args, env=serve_env(database_url), timeout=SERVE_TIMEOUT_S)
    assert result.returncode == 2, result.stderr
    assert f"argument {args[0]}" in result.stderr
    assert "Uvicorn running" not in result.stderr
    assert not listening(34463)


async def test_a_refused_start_does_not_leak_the_outbound_client_session(
    database_url: str,
) -> None:
    """The key check fails after the HTTP client was opened; it must be closed again."""
    stderr = await refuses_to_serve(serve_env(database_url, TOOLGATE_JWT_SECRET="s" * 31))
    assert "Unclosed client session" not in stderr, stderr


async def test_serve_refuses_an_invalid_catalog(database_url: str, tmp_path: Path) -> None:
    text = BASE.replace(
        "    mutation: false\n    provider: billing\n", "    mutation: false\n    provider: ups\n"
    )
    path = write(tmp_path, text)
    line = text.splitlines().index("    provider: ups") + 1
    await refuses_to_serve(
        serve_env(database_url, TOOLGATE_CATALOG=str(path)), "invalid catalog", f"{path}:{line}"
    )


async def test_serve_refuses_a_database_that_is_not_migrated(empty_database: str) -> None:
    await refuses_to_serve(serve_env(empty_database), "toolgate migrate")


async def test_serve_refuses_a_database_that_does_not_exist(admin_dsn: str) -> None:
    missing = with_database(admin_dsn, f"toolgate_missing_{secrets.token_hex(4)}")
    await refuses_to_serve(serve_env(missing), "does not exist")


# --- migrate ----------------------------------------------------------------------------------


async def test_migrate_applies_every_migration_and_is_idempotent(empty_database: str) -> None:
    env = base_env(TOOLGATE_DATABASE_URL=empty_database)
    versions = [version for version, _ in migration_files()]
    assert versions

    first = await run("migrate", env=env)
    assert first.returncode == 0, first.stderr
    for version in versions:
        assert version in first.stdout

    second = await run("migrate", env=env)
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout
    assert not any(version in second.stdout for version in versions)

    conn = await asyncpg.connect(empty_database)
    try:
        applied = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
        assert sorted(applied) == versions
        assert await conn.fetchval("SELECT to_regclass('calls') IS NOT NULL")
    finally:
        await conn.close()


@pytest.mark.parametrize("algorithms", ["HS384", "HS512", "RS256"])
async def test_the_demo_accepts_what_token_mints_with_the_demo_secret(algorithms: str) -> None:
    """Both fall back to the published demo secret when no key is configured, and token signs
    with it in HS256: the demo kept TOOLGATE_JWT_ALGORITHMS, so it refused to start (the
    secret too short for HS384/HS512, or no key for RS256) where it ran before."""
    env = base_env(TOOLGATE_JWT_ALGORITHMS=algorithms)
    result = await run("token", "--sub", "a", "--tenant", "t", env=env)
    assert result.returncode == 0, result.stderr
    demo.prepare(env)
    settings = Settings.from_env(env)
    settings.check_keys()
    principal = await TokenVerifier(settings, Outbound()).verify(result.stdout.strip())
    assert (principal.sub, principal.tenant) == ("a", "t")


@pytest.mark.parametrize("as_json", [False, True])
def test_an_interrupted_audit_verify_never_reads_as_intact(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Ctrl-C or SIGTERM during a verify ended it with status 0, which a script reads as
    "the chain is intact"."""
    from contextlib import contextmanager

    from app import cli

    @contextmanager
    def no_store(settings: Any, *, migrated: bool) -> Any:
        yield settings

    async def stopped(*args: Any, **kwargs: Any) -> int:
        raise cli.Stopped

    monkeypatch.setattr(cli, "_store", no_store)
    monkeypatch.setattr(cli, "_audit_verify", stopped)
    monkeypatch.setenv("TOOLGATE_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/x")
    status = cli.main(["audit", "verify", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert status == 2
    assert "interrupted" in err
    if as_json:
        assert json.loads(out) == {"ok": False, "error": "interrupted"}
