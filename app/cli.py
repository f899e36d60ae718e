"""The ``toolgate`` command: serve, migrate, check, token (SPEC §2), audit verify and keygen."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from app.settings import ConfigError, Settings

# CLI flags that override the matching TOOLGATE_* variable, for every subcommand.
_OVERRIDES = {
    "catalog": "TOOLGATE_CATALOG",
    "database_url": "TOOLGATE_DATABASE_URL",
    "redis_url": "TOOLGATE_REDIS_URL",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolgate", description=__doc__)
    parser.add_argument("--catalog", help="catalog file or directory (TOOLGATE_CATALOG)")
    parser.add_argument("--database-url", help="postgresql:// URL (TOOLGATE_DATABASE_URL)")
    parser.add_argument("--redis-url", help="redis:// URL (TOOLGATE_REDIS_URL)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the service")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1)
    commands.add_parser("migrate", help="apply the SQL migrations")
    check = commands.add_parser("check", help="validate a catalog")
    check.add_argument("path", nargs="?", help="catalog file or directory")
    token = commands.add_parser("token", help="mint an HS256 token for local trials")
    token.add_argument("--sub", required=True)
    token.add_argument("--tenant", required=True)
    token.add_argument("--roles", default="")
    token.add_argument("--ttl", type=int, default=3600)
    audit = commands.add_parser("audit", help="the audit trail")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_commands.add_parser(
        "verify",
        help="seal pending rows, recompute the hash chain, check its signed head and "
        "published checkpoints, name the first broken row",
    )
    verify.add_argument(
        "--checkpoints",
        type=Path,
        metavar="FILE",
        help="checkpoints published outside the database (the TOOLGATE_AUDIT_CHECKPOINT_FILE, "
        "or the sealer's 'audit checkpoint' log lines): the chain must still hold each one",
    )
    verify.add_argument(
        "--public-key",
        type=Path,
        metavar="PEM",
        help="the checkpoints' Ed25519 public key (default: that of TOOLGATE_AUDIT_SIGNING_KEY)",
    )
    keygen = audit_commands.add_parser(
        "keygen",
        help="write a new Ed25519 key for TOOLGATE_AUDIT_SIGNING_KEY; print its public key",
    )
    keygen.add_argument("--out", type=Path, required=True, metavar="PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for flag, variable in _OVERRIDES.items():
        if getattr(args, flag):
            os.environ[variable] = getattr(args, flag)
    try:
        settings = Settings.from_env()
        if args.command == "serve":
            return _serve(settings, args.host, args.port, args.workers)
        if args.command == "migrate":
            applied = asyncio.run(_migrate(settings))
            print(f"applied: {', '.join(applied)}" if applied else "schema is up to date")
            return 0
        if args.command == "check":
            return _check(settings, Path(args.path) if args.path else settings.catalog_path)
        if args.command == "audit" and args.audit_command == "keygen":
            return _audit_keygen(args.out)
        if args.command == "audit":
            return asyncio.run(_audit_verify(settings, args.checkpoints, args.public_key))
        roles = [r for r in args.roles.split(",") if r]
        from app.auth.tokens import mint

        print(mint(settings, args.sub, args.tenant, roles, args.ttl))
        return 0
    except ConfigError as exc:
        print(f"toolgate: {exc}", file=sys.stderr)
        return 2


async def _migrate(settings: Settings) -> list[str]:
    from app.db import migrate
    from app.errors import Unavailable

    try:
        return await migrate(settings.check_database())
    except Unavailable as exc:
        raise ConfigError(exc.detail) from None


def _audit_keygen(out: Path) -> int:
    """The private key goes to ``out`` (mode 0600, never over a file); the public key, which
    auditors verify checkpoints with, to stdout."""
    from app.audit.checkpoints import SigningKey

    key = SigningKey.generate()
    key.save(out)
    print(f"wrote {out} (key id {key.public.key_id}); its public key:", file=sys.stderr)
    print(key.public.pem(), end="")
    return 0


async def _audit_verify(settings: Settings, exported: Path | None, public: Path | None) -> int:
    """Exit 0 when the chain is intact, 1 when it is broken or stalled (the report says
    where), 2 when it cannot be checked."""
    from app.audit import checkpoints
    from app.audit.service import seal_and_verify
    from app.db import pending_migrations
    from app.errors import Unavailable

    url = settings.check_database()
    key = checkpoints.signing_key(settings)
    public_key = key.public if key else None
    if public is not None:
        public_key = checkpoints.PublicKey.load(public)
    published = checkpoints.read(exported) if exported else []
    try:
        if await pending_migrations(url):
            raise ConfigError("the database schema is not migrated; run `toolgate migrate`")
        report = await seal_and_verify(url, key, public_key, published)
    except Unavailable as exc:
        raise ConfigError(exc.detail) from None
    print(report.summary())
    return 0 if report.ok else 1


def _check(settings: Settings, path: Path) -> int:
    from app.catalog.loader import CatalogError, load

    try:
        catalog = load(path, settings.env)
    except CatalogError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"{len(exc.problems)} problem(s) in {path}", file=sys.stderr)
        return 1
    print(f"{path}: {len(catalog.tools)} tools, policy_version {catalog.policy_version}")
    return 0


def _serve(settings: Settings, host: str, port: int, workers: int) -> int:
    """Check everything a worker would, so a bad start fails here with a clear message."""
    import uvicorn

    from app.audit import checkpoints, sealer
    from app.catalog.loader import CatalogError
    from app.errors import Unavailable
    from app.logs import log_config
    from app.main import close_state, open_state
    from app.protocol import LimitedHttpToolsProtocol

    async def preflight() -> None:
        await close_state(await open_state(settings))

    try:
        checkpoints.signing_key(settings)
        asyncio.run(preflight())
    except CatalogError as exc:
        raise ConfigError(f"invalid catalog:\n{exc}") from None
    except Unavailable as exc:
        raise ConfigError(exc.detail) from None
    sealing = sealer.spawn()
    try:
        uvicorn.run(
            "app.main:serve_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            loop="uvloop",
            http=LimitedHttpToolsProtocol,
            log_level="info",
            log_config=log_config(),
            access_log=False,  # one JSON line per decision and outcome says more, for less
            proxy_headers=False,  # nothing here reads the client's address
            server_header=False,
        )
    finally:
        sealing.terminate()
        sealing.wait(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
