"""The ``toolgate`` command: serve, migrate, check, test, catalog import-openapi,
catalog-schema, token, audit verify and keygen, demo.

Without ``TOOLGATE_DATABASE_URL``, the commands that need a database (serve, migrate, audit
verify, demo) run on the embedded store in ``TOOLGATE_DATA_DIR`` (``app.embedded``): started
and migrated first, stopped at the end by the process that started it, SIGTERM or SIGINT
included.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import logging.config
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import FrameType
from urllib.parse import parse_qs, urlsplit

from app.progress import Report
from app.settings import MAX_TTL_S, ConfigError, Settings

# CLI flags that override the matching TOOLGATE_* variable, for every subcommand.
_OVERRIDES = {
    "catalog": "TOOLGATE_CATALOG",
    "database_url": "TOOLGATE_DATABASE_URL",
    "redis_url": "TOOLGATE_REDIS_URL",
    "data_dir": "TOOLGATE_DATA_DIR",
}
log = logging.getLogger("toolgate")


class Stopped(BaseException):
    """SIGTERM or SIGINT: unwinds like ``KeyboardInterrupt``, so what the command started
    (the embedded store above all) is stopped on the way out. uvicorn re-raises the signal
    it caught once it has shut down; without this handler SIGTERM would then end the
    process on the spot, leaving the store running."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


DESCRIPTION = """\
toolgate authorizes LLM-agent tool calls against a YAML tool catalog.
The options before the command override the environment variable named in
their help. Without a database URL, serve, migrate, audit verify and demo run an
embedded PostgreSQL in the data dir (default ./.toolgate), created and migrated
on first use and stopped by the command that started it."""


def _counted(what: str, highest: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``highest``, else ``what`` is refused."""

    def parse(value: str) -> int:
        number = int(value) if value.isascii() and value.isdigit() else 0
        if number < 1 or (highest is not None and number > highest):
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}")
        return number

    return parse


# The socket layer would take port 99999 as 34463 (modulo 65536), silently.
_port = _counted("a port (1-65535)", 65535)
_workers = _counted("a number of workers (1 or more)")
# A token that expired as it was minted, or outlives any use, only fails later, unexplained.
_ttl = _counted(f"a number of seconds (1-{MAX_TTL_S})", MAX_TTL_S)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolgate",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--catalog", help="catalog file or directory of *.yaml files (TOOLGATE_CATALOG)"
    )
    parser.add_argument("--database-url", help="postgresql:// URL (TOOLGATE_DATABASE_URL)")
    parser.add_argument(
        "--redis-url", help="redis:// URL; without it, locks are in PostgreSQL (TOOLGATE_REDIS_URL)"
    )
    parser.add_argument(
        "--data-dir",
        help="the embedded store's directory, without a database URL (TOOLGATE_DATA_DIR)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the service",
        description="Run the service; refuses to start on an invalid catalog, a missing or "
        "unusable key, or a database that is unreachable or not migrated.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    serve.add_argument("--port", type=_port, default=8080, help="port to listen on (%(default)s)")
    serve.add_argument("--workers", type=_workers, default=1, help="worker processes (%(default)s)")
    commands.add_parser(
        "migrate",
        help="apply the SQL migrations",
        description="Apply the SQL migrations the database lacks; safe to run again.",
    )
    check = commands.add_parser(
        "check",
        help="validate a catalog",
        description="Validate a catalog and print every problem with its file and line; "
        "exit 0 only when it is valid.",
    )
    check.add_argument(
        "path", nargs="?", help="catalog file or directory (default: the configured catalog)"
    )
    tests = commands.add_parser(
        "test",
        help="test a catalog's decisions offline",
        description="Run catalog test files (*_test.yaml): each names its catalog and gives "
        "the facts (principals, owners, known values, a run's task and results); each case "
        "proposes a call and states the decision toolgate must take. No database, Redis or "
        "provider is used. Prints each failing case with its file:line; exit 0 only when "
        "every case of every file passed.",
    )
    tests.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH", help="test files, or directories to search"
    )
    tests.add_argument(
        "--junit", type=Path, metavar="FILE", help="also write the results as JUnit XML"
    )
    catalog = commands.add_parser("catalog", help="work on catalog files")
    catalog_commands = catalog.add_subparsers(dest="catalog_command", required=True)
    imported = catalog_commands.add_parser(
        "import-openapi",
        help="draft catalog entries from an OpenAPI 3.x document",
        description="Draft a catalog file from the operations of an OpenAPI 3.x document "
        "(JSON or YAML, a local file): one tool per operation, with its parameters, mutation "
        "from the method and DELETE high impact; what to review is left as comments. "
        "Operations toolgate cannot call are listed on stderr with the reason. Exit 0 when "
        "at least one operation was translated.",
    )
    imported.add_argument("spec", type=Path, metavar="SPEC", help="the OpenAPI document")
    imported.add_argument("--provider", required=True, help="the provider's name in the catalog")
    imported.add_argument(
        "--base-url", help="the provider's base URL (default: the document's first server)"
    )
    imported.add_argument(
        "--out", type=Path, metavar="FILE", help="write here (never over a file) instead of stdout"
    )
    commands.add_parser(
        "catalog-schema",
        help="print the JSON Schema of catalog files",
        description="Print the JSON Schema (2020-12) of a catalog file, for editors and CI. "
        "It checks each file's keys and types; `toolgate check` checks everything else.",
    )
    token = commands.add_parser(
        "token",
        help="mint a token for local trials",
        description="Mint a token signed with TOOLGATE_JWT_SECRET: HS256, or the first of "
        "TOOLGATE_JWT_ALGORITHMS when it leaves HS256 out (with no key configured at all: the "
        "demo's secret, said on stderr).",
    )
    token.add_argument("--sub", required=True, help="the user (sub claim)")
    token.add_argument("--tenant", required=True, help="the tenant (tenant claim)")
    token.add_argument(
        "--roles",
        default="",
        help="roles, separated by commas and/or whitespace ('support,finance_approver' or "
        "'support finance_approver')",
    )
    token.add_argument("--ttl", type=_ttl, default=3600, help="seconds valid (%(default)s)")
    demo = commands.add_parser(
        "demo",
        help="run toolgate with the demo catalog and providers, ready to try",
        description="Run toolgate with the demo catalog and the demo providers in one process "
        "tree, and print tokens for the demo users; Ctrl-C stops all of it. The providers "
        "listen on DEMO_PROVIDERS_URL (default http://127.0.0.1:9100).",
    )
    demo.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    demo.add_argument("--port", type=_port, default=8080, help="port to listen on (%(default)s)")
    demo.add_argument("--data-dir", dest="demo_data_dir", help="the embedded store's directory")
    audit = commands.add_parser("audit", help="the audit trail")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_commands.add_parser(
        "verify",
        help="seal pending rows, recompute the hash chain, check its signed head and "
        "published checkpoints, name the first broken row",
        description="Seal pending rows, recompute the hash chain, check its signed head and "
        "published checkpoints, and name the first broken row. Exit 0: intact; 1: broken or "
        "stalled; 2: it cannot be checked.",
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
    verify.add_argument(
        "--archive",
        type=Path,
        metavar="DIR",
        help="where retention archived removed months (TOOLGATE_AUDIT_ARCHIVE_DIR): recompute "
        "their files and check that they lead to where the database's chain starts",
    )
    verify.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object (an error too, with exit status 2)",
    )
    keygen = audit_commands.add_parser(
        "keygen",
        help="write a new Ed25519 key for TOOLGATE_AUDIT_SIGNING_KEY; print its public key",
    )
    keygen.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="PATH",
        help="where to write the private key (mode 0600; an existing file is never overwritten)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for flag, variable in _OVERRIDES.items():
        if getattr(args, flag):
            os.environ[variable] = getattr(args, flag)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
    if args.command == "test":
        return _test(args.paths, args.junit)
    if args.command == "catalog":
        return _import_openapi(args.spec, args.provider, args.base_url, args.out)
    if args.command == "catalog-schema":
        from app.catalog.spec import json_schema

        print(json.dumps(json_schema(), indent=2))
        return 0
    try:
        settings = Settings.from_env()
        if args.command == "serve":
            _log_to_stderr()
            with _store(settings, migrated=True) as settings:
                return _serve(settings, args.host, args.port, args.workers)
        if args.command == "migrate":
            with _store(settings, migrated=False) as settings, _progress() as progress:
                applied = asyncio.run(_migrate(settings, progress))
            print(f"applied: {', '.join(applied)}" if applied else "schema is up to date")
            return 0
        if args.command == "demo":
            return _demo(args.host, args.port, args.demo_data_dir)
        if args.command == "check":
            return _check(settings, Path(args.path) if args.path else settings.catalog_path)
        if args.command == "audit" and args.audit_command == "keygen":
            return _audit_keygen(args.out)
        if args.command == "audit":
            try:
                with _store(settings, migrated=True) as settings, _progress() as progress:
                    return asyncio.run(
                        _audit_verify(
                            settings,
                            args.checkpoints,
                            args.public_key,
                            args.archive,
                            progress,
                            as_json=args.json,
                        )
                    )
            except ConfigError as exc:
                if args.json:
                    print(json.dumps({"ok": False, "error": str(exc)}))
                raise
        from app.auth.tokens import mint, split_roles

        roles = split_roles(args.roles)
        _check_claims(args.sub, args.tenant, roles)

        settings = _token_settings(settings)
        settings.check_keys()  # a token serve, given these keys, would never accept
        print(mint(settings, args.sub, args.tenant, roles, args.ttl))
        return 0
    except ConfigError as exc:
        print(f"toolgate: {exc}", file=sys.stderr)
        return 2
    except Stopped:
        if args.command in ("serve", "demo"):
            return 0  # asked to stop: their normal end
        # Work cut short proves nothing: an interrupted verify must never read as intact.
        print(f"toolgate: {args.command} interrupted", file=sys.stderr)
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": "interrupted"}))
        return 2


@contextmanager
def _store(settings: Settings, *, migrated: bool) -> Iterator[Settings]:
    """``settings`` with a database: ``TOOLGATE_DATABASE_URL`` as given, or the embedded store
    in the data dir (migrated first when ``migrated``). Its URL is put in the environment,
    where the processes ``serve`` starts (workers, sealer) read it."""
    if settings.database_url:
        log.info("store: PostgreSQL at %s (TOOLGATE_DATABASE_URL)", _where(settings.database_url))
        yield settings
        return
    from app.embedded import EmbeddedPostgres

    store = EmbeddedPostgres(settings.data_dir)
    url = store.start()
    try:
        if store.adopted:
            log.warning("embedded PostgreSQL in %s was left running; reusing it", store.pgdata)
        log.info("store: embedded PostgreSQL in %s", store.pgdata)
        if migrated:
            with _progress() as progress:
                asyncio.run(_migrate(dataclasses.replace(settings, database_url=url), progress))
        os.environ["TOOLGATE_DATABASE_URL"] = url
        yield dataclasses.replace(settings, database_url=url)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):  # a second Ctrl-C must not skip this
            signal.signal(signum, signal.SIG_IGN)
        store.stop()


async def _migrate(settings: Settings, progress: Report) -> list[str]:
    """The pending migrations, then the known values brought under the current key (when
    one is set: without it, known values are off and stay as they are)."""
    from app.db import migrate
    from app.errors import Unavailable

    url = settings.check_database()
    try:
        applied = await migrate(url, progress)
        if settings.known_values_keys:
            await _rekey(url, settings.known_values_keys)
    except Unavailable as exc:
        raise ConfigError(exc.detail) from None
    return applied


async def _rekey(url: str, keys: tuple[bytes, ...]) -> None:
    """Known values digested under the current key; what could not be, told."""
    from app.db import Database
    from app.known.service import rekey

    db = Database(url)
    await db.open(min_size=1, max_size=1)
    try:
        done = await rekey(db, keys)
    finally:
        await db.close()
    if done.redigested:
        print(f"known values: {done.redigested} digested under the current key", file=sys.stderr)
    if done.kept:
        print(
            f"known values: {done.kept} sensitive ones endorse under the previous key until"
            " entered again (keep TOOLGATE_KNOWN_VALUES_PREVIOUS_KEY until then)",
            file=sys.stderr,
        )
    for row in done.removed:
        whose = f"user {row.user_sub!r}" if row.user_sub else "the tenant"
        print(
            f"known values: removed a sensitive {row.kind!r} of tenant {row.tenant!r} for"
            f" {whose}, added by {row.added_by!r}: its digest is under no configured key and"
            " its value was never kept; enter it again to have it endorse",
            file=sys.stderr,
        )


def _audit_keygen(out: Path) -> int:
    """The private key goes to ``out`` (mode 0600, never over a file); the public key, which
    auditors verify checkpoints with, to stdout."""
    from app.audit.checkpoints import SigningKey

    key = SigningKey.generate()
    key.save(out)
    print(f"wrote {out} (key id {key.public.key_id}); its public key:", file=sys.stderr)
    print(key.public.pem(), end="")
    return 0


async def _audit_verify(
    settings: Settings,
    exported: Path | None,
    public: Path | None,
    archive: Path | None,
    progress: Report,
    *,
    as_json: bool,
) -> int:
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
    if archive is not None and not archive.is_dir():
        raise ConfigError(f"--archive {archive}: not a directory")
    try:
        if await pending_migrations(url):
            raise ConfigError("the database schema is not migrated; run `toolgate migrate`")
        days = settings.audit_retention_days
        horizon = timedelta(days=days) if days else None
        report = await seal_and_verify(url, key, public_key, published, archive, horizon, progress)
    except Unavailable as exc:
        raise ConfigError(exc.detail) from None
    if as_json:
        print(json.dumps(report.as_json()))
    else:
        print(report.summary())
    return 0 if report.ok else 1


@contextmanager
def _progress() -> Iterator[Report]:
    """Progress on standard error while it is a terminal; its line cleared at the end."""
    from app.progress import Progress

    progress = Progress()
    try:
        yield progress
    finally:
        progress.close()


def _check_claims(sub: str, tenant: str, roles: list[str]) -> None:
    """Refuse a name the verifier would refuse (``tokens.identifier``, and for a role
    ``tokens.role_name``): the token would be printed, then every request with it answered
    a bare 401."""
    from app.auth.tokens import MAX_IDENTIFIER, identifier, role_name

    checks = (("--sub", identifier, [sub]), ("--tenant", identifier, [tenant]))
    for flag, fits, values in (*checks, ("--roles", role_name, roles)):
        if not all(fits(v) for v in values):
            raise ConfigError(
                f"{flag}: not a name toolgate accepts (1 to {MAX_IDENTIFIER} characters, no"
                " control characters)"
            )


def _token_settings(settings: Settings) -> Settings:
    """With no key configured at all, ``token`` signs with the demo's published secret (and
    says so): what ``toolgate demo`` accepts when ``TOOLGATE_JWT_SECRET`` is unset."""
    if settings.jwt_secret or settings.jwt_public_key_file or settings.jwks_url:
        return settings
    from app.demo import DEMO_SECRET

    print("toolgate: TOOLGATE_JWT_SECRET is not set; signed with the demo secret", file=sys.stderr)
    return dataclasses.replace(settings, jwt_secret=DEMO_SECRET, jwt_algorithms=("HS256",))


def _demo(host: str, port: int, data_dir: str | None) -> int:
    """The demo providers in a thread, then ``serve`` with the demo's settings."""
    from app import demo
    from examples.demo_providers import serve_in_background

    if data_dir:
        os.environ["TOOLGATE_DATA_DIR"] = data_dir
    providers_host, providers_port = demo.prepare(os.environ)
    demo.check_reach(host, os.environ)
    _log_to_stderr()
    try:
        stop_providers = serve_in_background(providers_host, providers_port)
    except OSError as exc:
        raise ConfigError(f"the demo providers cannot listen: {exc}") from None
    try:
        with _store(Settings.from_env(), migrated=True) as settings:
            settings.check_keys()
            print(demo.banner(settings, f"http://{host}:{port}", os.environ), flush=True)
            return _serve(settings, host, port, 1)
    finally:
        stop_providers()


def _log_to_stderr() -> None:
    from app.logs import log_config

    logging.config.dictConfig(log_config())


def _where(url: str) -> str:
    """Host, port and database of a URL, without its credentials."""
    parts = urlsplit(url)
    host = parts.hostname or parse_qs(parts.query).get("host", ["localhost"])[0]
    return f"{host}:{parts.port or 'default port'}{parts.path}"


def _check(settings: Settings, path: Path) -> int:
    from app.catalog.loader import CatalogError, load

    try:
        catalog = load(path, settings.env)
    except CatalogError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"{len(exc.problems)} problem(s) in {path}", file=sys.stderr)
        return 1
    for warning in catalog.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{path}: {len(catalog.tools)} tools, policy_version {catalog.policy_version}")
    return 0


def _test(paths: list[Path], junit: Path | None) -> int:
    from app.calls import offline
    from app.catalog.source import Problem

    outcomes: list[offline.Outcome] = []
    problems: list[Problem] = []
    found = offline.files(paths)
    if not found:
        problems.append(Problem(" ".join(map(str, paths)), None, (), f"no {offline.PATTERN}"))
    for path in found:
        try:
            outcomes.extend(offline.run_file(path))
        except offline.Malformed as exc:
            problems.extend(exc.problems)
    for problem in problems:
        print(problem, file=sys.stderr)
    failed = [o for o in outcomes if o.differences]
    for outcome in failed:
        print(outcome)
    print(
        f"{len(outcomes) - len(failed)} passed, {len(failed)} failed"
        + (f", {len(problems)} problem(s) in the test files" if problems else "")
    )
    if junit is not None:
        junit.write_bytes(offline.junit(outcomes, problems))
    return 1 if failed or problems else 0


def _import_openapi(spec: Path, provider: str, base_url: str | None, out: Path | None) -> int:
    import yaml

    from app.catalog.openapi_import import Unsupported, translate

    try:
        document = yaml.safe_load(spec.read_text(encoding="utf-8"))
        imported = translate(document, provider, base_url)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        print(f"toolgate: {spec}: cannot be read: {exc}", file=sys.stderr)
        return 1
    except Unsupported as exc:
        print(f"toolgate: {spec}: {exc}", file=sys.stderr)
        return 1
    for reason in imported.skipped:
        print(f"skipped {reason}", file=sys.stderr)
    if out is None:
        print(imported.text, end="")
    else:
        try:
            with out.open("x", encoding="utf-8") as written:
                written.write(imported.text)
        except OSError as exc:
            print(f"toolgate: --out {out}: {exc.strerror}", file=sys.stderr)
            return 1
    told = f"{len(imported.tools)} tools drafted, {len(imported.skipped)} operations skipped"
    print(told + "; review the comments, then run toolgate check", file=sys.stderr)
    return 0


def _serve(settings: Settings, host: str, port: int, workers: int) -> int:
    """Check everything a worker would, so a bad start fails here with a clear message."""
    import uvicorn

    from app.audit import checkpoints, sealer
    from app.catalog.loader import CatalogError
    from app.demo import DEMO_KNOWN_VALUES_KEY, DEMO_SECRET
    from app.errors import Unavailable
    from app.logs import log_config
    from app.main import close_state, open_state
    from app.protocol import LimitedHttpToolsProtocol

    async def preflight() -> None:
        await close_state(await open_state(settings))

    if settings.redis_url:
        log.info("locks: Redis at %s", _where(settings.redis_url))
    else:
        log.info("locks: PostgreSQL advisory locks (TOOLGATE_REDIS_URL is not set)")
    if settings.jwt_secret == DEMO_SECRET:
        log.warning(
            "TOOLGATE_JWT_SECRET is the published demo secret: anyone can sign a token for"
            " any user, tenant and role; set a secret of your own outside the demo"
        )
    if not settings.known_values_keys:
        log.warning(
            "TOOLGATE_KNOWN_VALUES_KEY is not set: known values are off (none endorses, none"
            " can be added); set it, then run `toolgate migrate`"
        )
    elif settings.known_values_keys[0] == DEMO_KNOWN_VALUES_KEY.encode():
        log.warning(
            "TOOLGATE_KNOWN_VALUES_KEY is the published demo key: known values' digests can"
            " be reversed by anyone; set a key of your own outside the demo"
        )
    try:
        checkpoints.signing_key(settings)
        settings.check_audit_paths()
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
