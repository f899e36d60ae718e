"""The PostgreSQL facade: a pool, explicit transactions, single statements committed
together with concurrent requests' (group commit), and failures mapped to 503.

Only this module imports asyncpg. SQL lives in each capability's ``store`` module and takes
a ``Connection`` from here; the use case owns the transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from enum import IntEnum, unique
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import asyncpg
import orjson

from app.errors import Unavailable
from app.progress import Report, quiet
from app.settings import ConfigError

Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record]"
Record: TypeAlias = asyncpg.Record
DatabaseError = asyncpg.PostgresError
"""An error the database answered a statement with."""
LockNotAvailable = asyncpg.LockNotAvailableError
"""A lock not granted within the session's ``lock_timeout``."""
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
"""Package data, so every install carries them (in a checkout, a link to ``migrations/``)."""
LISTENER_NAME = "toolgate-listener"
"""The ``application_name`` of listening connections, to tell them apart in
``pg_stat_activity``."""
LISTEN_PING_S = 5.0
LISTEN_RETRY_S = 0.5
LISTEN_RETRY_MAX_S = 10.0


@unique
class Lock(IntEnum):
    """Advisory lock keys, one per purpose, shared by every instance on one database."""

    MIGRATE = 74201
    SEALER = 74202
    RECONCILER = 74203
    PURGER = 74204
    CHAIN = 74205
    """Held shared by a verification while it reads the audit chain, page by page, and
    taken exclusively by retention to cut the chain (``app.audit.archive``)."""


_UNAVAILABLE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
)


def _encode_json(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # e.g. an integer beyond 64 bits in a denied call's raw arguments
        return json.dumps(value)


def _decode_json(text: str) -> Any:
    """A stored JSON document, read by orjson; the rare one it refuses goes to the stdlib.

    orjson reads 64-bit integers as ints and every other number as the nearest double, and
    refuses a number beyond double range (a 400-digit integer) and nesting deeper than 1024.
    Such rows exist (written before the API refused them, or by hand), and one of them must
    not fail every read that touches it: audit listing, sealing, verification.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _decode_unusual(text)


def _decode_unusual(text: str) -> Any:
    """Numbers as orjson reads them where it can, and one beyond double range as its decimal
    text (every digit kept, so it still hashes and renders); a document even the stdlib
    cannot read (nested too deep) stands in as the digest of its stored text."""
    try:
        return json.loads(text, parse_int=_integer, parse_float=_number)
    except (ValueError, RecursionError):
        digest = hashlib.sha256(text.encode()).hexdigest()
        return {"omitted": "not readable as JSON here", "digest": f"sha256:{digest}"}


_INT64 = range(-(2**63), 2**64)


def _integer(text: str) -> int | float | str:
    if len(text) <= 20 and int(text) in _INT64:
        return int(text)
    return _number(text)


def _number(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else text


SESSION = {"jit": "off"}
"""Settings of every pooled session. No JIT: toolgate's statements each read a page or a
batch, but on large tables the planner's cost estimates can cross JIT's threshold, and
compiling then takes a second where the query itself takes milliseconds."""
CLOSE_S = 5.0
"""How long closing a pooled connection may take (its interrupted statement cancelled, then
its session ended) before it is cut."""
IDLE_S = 300.0
"""A pooled connection unused for this long is closed as the next one is given back (while
more than the pool's ``min_size`` are open)."""


class Pool:
    """The process's connections to PostgreSQL: at most ``max_size`` open (``min_size``
    opened up front, so an unreachable database fails the start), idle ones handed out last
    in, first out, and a request that finds none idle and no room for another waits for
    one, first come, first served.

    Not asyncpg's pool, for speed: taking a connection and giving it back costs about 110 k
    instructions there (the release runs in a shielded task of its own, resets the
    connection and re-arms a timer) and about 9 k here, where a read takes one and a read
    in a run three (``bench/README.md``). Giving one back never awaits, so nothing can
    interrupt it: a connection that may be mid-statement or mid-transaction (its block was
    cancelled or failed on the connection, it is in a transaction, or it is closed) is
    closed, which rolls back what it had open and releases its session locks, and its place
    is free for a new one. Every other is idle again as it is: toolgate keeps no session
    state on pooled connections (session advisory locks are released by the one block that
    takes them, ``_session_lock``, which closes a connection that may still hold one)."""

    __slots__ = (
        "_closed",
        "_closing",
        "_connect",
        "_idle",
        "_max_size",
        "_min_size",
        "_open",
        "_waiting",
    )

    def __init__(
        self, connect: Callable[[], Awaitable[Connection]], min_size: int, max_size: int
    ) -> None:
        self._connect, self._min_size, self._max_size = connect, min_size, max_size
        self._idle: list[tuple[float, Connection]] = []
        """Idle connections with the time each was given back, the latest last."""
        self._open = 0
        """Connections open or being opened, idle or not."""
        self._waiting: deque[asyncio.Future[Connection | None]] = deque()
        """Requests waiting for a connection (``None``: for room to open one)."""
        self._closing: set[asyncio.Task[None]] = set()
        """Connections being closed: each holds its place until it is."""
        self._closed = False

    async def open(self) -> None:
        try:
            for _ in range(self._min_size):
                self._pass_on(await self._opened())
        except BaseException:
            await self.close()
            raise

    async def acquire(self) -> Connection:
        while not self._closed:
            if self._idle:
                conn = self._idle.pop()[1]
                if not conn.is_closed():
                    return conn
                self._drop(conn)  # the server ended it (a restart, say): open another
                continue
            if self._open < self._max_size:
                return await self._opened()
            waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                handed = await waiter
            except BaseException:  # cancelled, maybe after it was handed a connection
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    handed = waiter.result()
                    if handed is None:
                        self._pass_on(None)  # the room it was given
                    else:
                        self.release(handed, reusable=True)  # closed if the pool is
                raise
            if handed is not None:
                return handed
        raise Unavailable("database unavailable: the pool is closed")

    def release(self, conn: Connection, *, reusable: bool) -> None:
        """Give ``conn`` back: idle again if ``reusable`` and neither closed nor in a
        transaction; closed otherwise."""
        if reusable and not self._closed and not conn.is_closed() and not conn.is_in_transaction():
            self._pass_on(conn)
            return
        self._drop(conn)

    async def close(self) -> None:
        """Close the idle connections; those in use are closed as they are given back, and
        whoever waits for one is answered ``Unavailable``."""
        self._closed = True
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(Unavailable("database unavailable: the pool is closed"))
        idle, self._idle = self._idle, []
        for _, conn in idle:
            self._drop(conn)
        await asyncio.gather(*self._closing)

    async def _opened(self) -> Connection:
        self._open += 1
        try:
            return await self._connect()
        except BaseException:
            self._open -= 1
            self._pass_on(None)
            raise

    def _pass_on(self, conn: Connection | None) -> None:
        """Hand ``conn`` (or, ``None``, room to open one) to the first request still
        waiting; else keep it idle, closing the one idle longest if it has been for
        ``IDLE_S``."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is None:
            return
        now = time.monotonic()
        self._idle.append((now, conn))
        since, oldest = self._idle[0]
        if now - since > IDLE_S and self._open > self._min_size:
            del self._idle[0]
            self._drop(oldest)

    def _drop(self, conn: Connection) -> None:
        """Close ``conn`` (in the background, its statement cancelled first if one was
        interrupted: asyncpg sent the cancel request) and free its place once it is."""
        if conn.is_closed():
            self._closed_one()
            return
        closing = asyncio.get_running_loop().create_task(_close(conn))
        self._closing.add(closing)
        closing.add_done_callback(self._closed_one)

    def _closed_one(self, closing: asyncio.Task[None] | None = None) -> None:
        if closing is not None:
            self._closing.discard(closing)
        self._open -= 1
        self._pass_on(None)


async def _close(conn: Connection) -> None:
    with contextlib.suppress(Exception):  # it is aborted then
        await conn.close(timeout=CLOSE_S)


class Pooled:
    """``async with``: a connection of the pool, given back at the end of the block;
    connection trouble, on taking it or in the block, becomes ``Unavailable``. A block that
    ends by an interruption (cancelled, timed out) or connection trouble gives its
    connection back to be closed: a statement may still be running on it. A class rather
    than ``asynccontextmanager``: every request takes one, and this way it runs about half
    the Python."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def __aenter__(self) -> Connection:
        self._conn = await self._pool.acquire()
        return self._conn

    async def __aexit__(self, kind: type[BaseException] | None, error: Any, tb: Any) -> None:
        reusable = kind is None or (
            issubclass(kind, Exception) and not issubclass(kind, _UNAVAILABLE)
        )
        self._pool.release(self._conn, reusable=reusable)
        if isinstance(error, _UNAVAILABLE):
            raise Unavailable("database unavailable") from error


Queued: TypeAlias = tuple[str, Sequence[Any], asyncio.Future[Any]]
"""A statement's order (rule 8), its arguments, and its caller's future."""
MAX_GROUP = 256
"""The most statements one group commit sends (rule 3)."""


class Statements(Protocol):
    """What a group commit needs of a connection (an asyncpg ``Connection``; a fake in
    unit tests)."""

    async def fetchmany(self, query: str, args: Iterable[Sequence[Any]]) -> list[Record]: ...

    async def fetchval(self, query: str, *args: Any) -> Any: ...


class GroupCommit:
    """Group commit of one statement that concurrent requests each run with their own
    arguments: ``await group.commit(args)`` returns the first value of the one row the
    statement returns with ``args``, once it has committed. Under load this is most of what
    storing a call costs the worker and PostgreSQL; with no other request about, a group
    holds one statement and waits for none. The rules:

    1. A statement that arrives while no group is being written starts one at once; those
       that arrive while one is written queue and go together in the next group.
    2. A group of several is one ``fetchmany`` on one pooled connection: one round trip and
       one transaction, atomic (all of it is stored, or none).
    3. A group holds at most ``MAX_GROUP`` statements; the rest of the queue waits for the
       next group.
    4. Each statement must return one row, and each caller gets the first value of its own
       row: a group that does not return one row per statement fails every caller of it
       (whose row is whose is unknown).
    5. If the database refuses a group, nothing of it is stored, and each of its statements
       runs again on its own, so that only a faulty one fails.
    6. Connection trouble fails every caller of the group with an ``Unavailable`` of its
       own (a caller may add to its error, which must not reach another request).
    7. A caller that was cancelled is not woken; its statement may still commit.
    8. A group's statements run in the order of their ``order`` keys (``""`` by default):
       statements that lock rows by a key, a run's, give that key, so every group takes
       those locks in one order and no two groups wait for each other in a cycle.
    """

    __slots__ = ("_connect", "_queued", "_sql", "_writer")

    def __init__(self, connect: Callable[[], AbstractAsyncContextManager[Statements]], sql: str):
        self._connect, self._sql = connect, sql
        self._queued: list[Queued] = []
        self._writer: asyncio.Task[None] | None = None

    async def commit(self, args: Sequence[Any], order: str = "") -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queued.append((order, args, done))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write())
        return await done

    async def _write(self) -> None:
        try:
            while self._queued:
                group = sorted(self._queued[:MAX_GROUP], key=_order)
                del self._queued[:MAX_GROUP]
                try:
                    await self._send(group)
                except BaseException as exc:  # cancelled: the pool is closing
                    _fail(group, exc)
                    raise
        finally:
            self._writer = None
            _fail(self._queued, None)
            self._queued = []

    async def _send(self, group: list[Queued]) -> None:
        if len(group) > 1:
            try:
                async with self._connect() as conn:
                    rows = await conn.fetchmany(self._sql, [args for _, args, _ in group])
            except Unavailable as exc:
                _fail(group, exc)
                return
            except Exception:
                pass  # each on its own below, so that only a faulty statement fails
            else:
                if len(rows) != len(group):  # stored, but whose row is whose is unknown
                    _fail(group, RuntimeError(f"not one row per statement: {self._sql}"))
                    return
                for (_, _, done), row in zip(group, rows, strict=True):
                    _wake(done, row[0])
                return
        for _, args, done in group:
            try:
                async with self._connect() as conn:
                    value = await conn.fetchval(self._sql, *args)
            except Exception as exc:
                _wake(done, error=exc)
            else:
                _wake(done, value)


def _wake(done: asyncio.Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    """Wake a caller that still waits (one that was cancelled does not)."""
    if not done.done():
        if error is None:
            done.set_result(value)
        else:
            done.set_exception(error)


def _order(queued: Queued) -> str:
    return queued[0]


def _fail(group: list[Queued], cause: BaseException | None) -> None:
    """``Unavailable`` for each waiting caller of ``group``, an instance of its own."""
    for _, _, done in group:
        error = Unavailable("database unavailable")
        error.__cause__ = cause
        _wake(done, error=error)


class Database:
    def __init__(self, url: str) -> None:
        self._url = url
        self._pool: Pool | None = None
        self._groups: dict[str, GroupCommit] = {}

    async def open(self, min_size: int = 2, max_size: int = 20) -> None:
        pool = Pool(self._connected, min_size, max_size)
        await pool.open()
        self._pool = pool

    async def _connected(self) -> Connection:
        """A new pooled connection: JSON columns read and written by orjson, ``SESSION``'s
        settings, and a statement that takes more than 10 s failed (``Unavailable``)."""
        try:
            conn = await asyncpg.connect(self._url, command_timeout=10, server_settings=SESSION)
            try:
                await conn.set_type_codec(
                    "jsonb", encoder=_encode_json, decoder=_decode_json, schema="pg_catalog"
                )
            except BaseException:
                conn.terminate()
                raise
        except (*_UNAVAILABLE, asyncpg.PostgresError) as exc:
            raise Unavailable(f"database unreachable: {exc}") from exc
        return conn

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A connection inside one transaction; connection trouble becomes ``Unavailable``.
        A transaction left open (its ROLLBACK interrupted) is closed with its connection
        (``Pool``), which rolls it back."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def group_commit(self, sql: str, *args: Any, order: str = "") -> Any:
        """The first value of the one row ``sql`` returns, in a transaction of its own that
        it shares with concurrent callers of the same statement (``GroupCommit``; ``order``:
        its rule 8). For a statement atomic by itself; store functions reach it through
        ``write_one``."""
        group = self._groups.get(sql)
        if group is None:
            group = self._groups[sql] = GroupCommit(self.connection, sql)
        return await group.commit(args, order)

    def connection(self) -> Pooled:
        """A connection for reads outside an explicit transaction."""
        assert self._pool is not None, "Database.open() was not awaited"
        return Pooled(self._pool)

    @asynccontextmanager
    async def exclusively(self, key: int) -> AsyncIterator[bool]:
        """Whether this process took the session advisory lock ``key`` (one holder at a time
        across every instance on this database), held for the block on a connection of its
        own."""
        async with self.connection() as conn, _session_lock(conn, key, shared=False) as held:
            yield held

    @asynccontextmanager
    async def sharing(self, key: Lock) -> AsyncIterator[Connection]:
        """A connection holding the session advisory lock ``key`` shared for the block:
        sharers hold it together, and whoever takes it exclusively (``try_xact_lock``) waits
        for none of them but is refused while any holds it. Waits while it is held
        exclusively, for that transaction to end."""
        async with self.connection() as conn, _session_lock(conn, key, shared=True):
            yield conn

    async def listen(
        self, channel: str, on_message: Callable[[str], None], on_gap: Callable[[bool], None]
    ) -> None:
        """Deliver each ``NOTIFY`` on ``channel`` to ``on_message``, on a connection of its own
        (outside the pool), until cancelled. A notification sent while no connection listens
        is lost, so ``on_gap`` is called whenever listening (re)starts (``on_gap(True)``) and
        when the connection drops (``on_gap(False)``: until the next ``True``, nothing is
        heard); the connection is then reopened, after a growing pause."""
        pause = LISTEN_RETRY_S
        while True:
            with contextlib.suppress(*_UNAVAILABLE, asyncpg.PostgresError):
                await self._listen_once(channel, on_message, on_gap)
                pause = LISTEN_RETRY_S  # it was up: reconnect soon
            on_gap(False)
            await asyncio.sleep(pause)
            pause = min(pause * 2, LISTEN_RETRY_MAX_S)

    async def _listen_once(
        self, channel: str, on_message: Callable[[str], None], on_gap: Callable[[bool], None]
    ) -> None:
        """Listen on one connection until it drops; a silent network loss shows as a failed
        ping."""
        dropped = asyncio.Event()
        conn = await asyncpg.connect(self._url, server_settings={"application_name": LISTENER_NAME})
        try:
            conn.add_termination_listener(lambda _conn: dropped.set())
            await conn.add_listener(channel, lambda _c, _p, _ch, payload: on_message(payload))
            on_gap(True)
            while not dropped.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(dropped.wait(), LISTEN_PING_S)
                if not dropped.is_set():
                    await conn.fetchval("SELECT 1", timeout=LISTEN_PING_S)
        finally:
            if not conn.is_closed():
                conn.terminate()

    async def ping(self) -> bool:
        try:
            async with self.connection() as conn:
                return bool(await conn.fetchval("SELECT 1"))
        except Unavailable:
            return False


Writer: TypeAlias = "Connection | Database"
"""Where a single statement that is atomic by itself is written: a connection (inside a
use case's transaction), or the database (outside one: committed by group commit)."""


async def write_one(writer: Writer, sql: str, *args: Any, order: str = "") -> Any:
    """The first value of the one row ``sql`` returns: on the transaction's connection, or
    through the database's group commit (in the ``order`` of the rows it locks: its rule
    8)."""
    if isinstance(writer, Database):
        return await writer.group_commit(sql, *args, order=order)
    return await writer.fetchval(sql, *args)


async def one_row(conn: Connection, sql: str, *args: Any) -> Record:
    """The row of a statement that always returns exactly one (an aggregate)."""
    row = await conn.fetchrow(sql, *args)
    if row is None:
        raise RuntimeError(f"no row from a statement that always returns one: {sql}")
    return row


@dataclass(frozen=True)
class Insert:
    """The INSERT of a row type, a ``NamedTuple`` whose fields are the table's columns,
    leaving out those the database fills in."""

    sql: str
    columns: tuple[str, ...]
    values: Callable[[Any], tuple[Any, ...]]
    """A row's values in column order, read in one call (``attrgetter``; a row type has
    more than one column, so it gives a tuple)."""

    @classmethod
    def of(cls, table: str, fields: Iterable[str], generated: Iterable[str] = ()) -> Insert:
        """``fields``: the row type's (``CallRow._fields``)."""
        skip = set(generated)
        columns = tuple(name for name in fields if name not in skip)
        placeholders = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders})"
        return cls(sql, columns, attrgetter(*columns))


def columns(row_type: Any) -> str:
    """A row type's columns (a ``NamedTuple`` whose fields are its table's), as a ``SELECT``
    list in its fields' order, so that each record read builds its row by position,
    ``RowType(*record)``: by name, ``RowType(**dict(record))``, costs ten times as much
    (measured: 5.8 µs against 0.6 µs for a run's 22 columns)."""
    return ", ".join(row_type._fields)


def migration_files() -> list[tuple[str, Path]]:
    """The migrations in order; none at all means a broken install, never an empty schema.

    Without this check an install that lost its migrations would report every database as
    up to date, and ``serve`` would start on one that has no tables.
    """
    found = sorted((p.stem, p) for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    if not found:
        raise ConfigError(f"no migrations found in {MIGRATIONS}: this installation is incomplete")
    return found


_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


async def _connect(url: str) -> Connection:
    try:
        return await asyncpg.connect(url)
    except (*_UNAVAILABLE, asyncpg.PostgresError) as exc:
        raise Unavailable(f"database unreachable: {exc}") from exc


@asynccontextmanager
async def _session_lock(conn: Connection, key: int, *, shared: bool) -> AsyncIterator[bool]:
    """``key`` on ``conn``'s session for the block: waited for shared, or tried exclusively
    (held or not). Pooled connections are not reset (``Pool``), so it is released before
    ``conn`` goes back; a connection that may still hold it is closed, which releases it."""
    try:
        if shared:
            await conn.execute("SELECT pg_advisory_lock_shared($1)", key)
        held = shared or bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", key))
    except BaseException:
        conn.terminate()
        raise
    try:
        yield held
    finally:
        if held:
            unlock = "pg_advisory_unlock_shared" if shared else "pg_advisory_unlock"
            try:
                await conn.execute(f"SELECT {unlock}($1)", key)
            except BaseException:
                conn.terminate()
                raise


async def try_xact_lock(conn: Connection, key: Lock) -> bool:
    """Take the advisory lock ``key`` exclusively until this transaction ends; False if
    anyone holds it, shared or not."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", key))


async def migrate(url: str, report: Report = quiet) -> list[str]:
    """Apply pending migrations in order, each in its own transaction; return their names
    (``report`` is told how many of those pending are applied).

    An advisory lock keeps two instances from migrating at once.
    """
    files = migration_files()
    conn = await _connect(url)
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", Lock.MIGRATE)
        await conn.execute(_SCHEMA_TABLE)
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        pending = [(version, path) for version, path in files if version not in done]
        for version, path in pending:
            report("applying migrations", len(applied), len(pending))
            async with conn.transaction():
                await conn.execute(path.read_text(encoding="utf-8"))
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            applied.append(version)
    finally:
        await conn.close()
    return applied


async def pending_migrations(url: str) -> list[str]:
    """Migrations not yet applied to the database at ``url`` (all of them if none are)."""
    files = migration_files()
    conn = await _connect(url)
    try:
        exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        done = (
            {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            if exists
            else set()
        )
    finally:
        await conn.close()
    return [version for version, _ in files if version not in done]
