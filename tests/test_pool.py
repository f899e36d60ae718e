"""The connection pool (``app.db.Pool``) on a real PostgreSQL: connections are reused, at
most ``max_size`` are open, waiters are served in turn, and a connection that may be
mid-statement or mid-transaction is closed rather than handed to the next request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest

from app import db as db_module
from app.db import Connection, Database, Pool, Pooled
from app.errors import Unavailable


@pytest.fixture
async def database(lone_database: str) -> AsyncIterator[Database]:
    db = Database(lone_database)
    await db.open(min_size=1, max_size=2)
    yield db
    await db.close()


async def backend(conn: Connection) -> int:
    return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def alive(lone_database: str, pid: int) -> bool:
    """Whether PostgreSQL still has the backend ``pid`` (asked on a connection of its own)."""
    conn = await asyncpg.connect(lone_database)
    try:
        return bool(
            await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
        )
    finally:
        await conn.close()


async def eventually(check: Callable[[], bool]) -> bool:
    """Whether ``check`` holds within 2 s (connections are closed in the background)."""
    for _ in range(100):
        if check():
            return True
        await asyncio.sleep(0.02)
    return check()


async def test_a_connection_given_back_serves_the_next_block(database: Database) -> None:
    async with database.connection() as conn:
        first = await backend(conn)
    async with database.connection() as conn:
        assert await backend(conn) == first
        assert await conn.fetchval("SELECT '{\"a\": 1}'::jsonb") == {"a": 1}  # orjson codec


async def test_past_max_size_a_request_waits_for_a_connection_given_back(
    database: Database,
) -> None:
    held = [database.connection() for _ in range(2)]
    pids = [await backend(await block.__aenter__()) for block in held]
    third = asyncio.create_task(_pid_of_next(database))
    await asyncio.sleep(0.1)
    assert not third.done()  # two open, both in use: it waits
    await held[1].__aexit__(None, None, None)
    assert await asyncio.wait_for(third, 5) == pids[1]  # the one given back, not a third
    await held[0].__aexit__(None, None, None)


async def _pid_of_next(database: Database) -> int:
    async with database.connection() as conn:
        return await backend(conn)


async def test_a_waiter_cancelled_loses_no_connection(database: Database) -> None:
    held = [database.connection() for _ in range(2)]
    for block in held:
        await block.__aenter__()
    waiter = asyncio.create_task(_pid_of_next(database))
    await asyncio.sleep(0.05)
    waiter.cancel()
    for block in held:
        await block.__aexit__(None, None, None)
    with pytest.raises(asyncio.CancelledError):
        await waiter
    both = [database.connection() for _ in range(2)]  # both came back, none is lost
    conns = await asyncio.wait_for(asyncio.gather(*(b.__aenter__() for b in both)), 5)
    assert len({await backend(c) for c in conns}) == 2
    for block in both:
        await block.__aexit__(None, None, None)


async def test_a_block_cancelled_mid_statement_closes_its_connection(
    database: Database, lone_database: str
) -> None:
    started = asyncio.Event()
    pid: list[int] = []

    async def sleeper() -> None:
        async with database.connection() as conn:
            pid.append(await backend(conn))
            started.set()
            await conn.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(sleeper())
    await started.wait()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with database.connection() as conn:  # another connection, ready at once
        assert await backend(conn) != pid[0]
        assert await conn.fetchval("SELECT 1") == 1
    for _ in range(50):  # the closed connection's statement ends with it
        if not await alive(lone_database, pid[0]):
            break
        await asyncio.sleep(0.1)
    assert not await alive(lone_database, pid[0])


async def test_a_connection_left_in_a_transaction_is_closed_not_reused(
    database: Database,
) -> None:
    async with database.connection() as conn:
        left = await backend(conn)
        await conn.execute("BEGIN")
        await conn.execute("SET LOCAL statement_timeout = 1")
    async with database.connection() as conn:
        assert await backend(conn) != left
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SHOW statement_timeout") == "0"


async def test_a_database_error_keeps_the_connection(database: Database) -> None:
    async with database.connection() as conn:
        kept = await backend(conn)
        with pytest.raises(asyncpg.DivisionByZeroError):
            await conn.fetchval("SELECT 1 / 0")
    async with database.connection() as conn:
        assert await backend(conn) == kept


async def one_held_one_waiting(
    lone_database: str,
) -> tuple[Database, Pooled, Connection, asyncio.Task[int]]:
    """A pool of one connection, held (its block and the connection), and a request
    waiting for it."""
    db = Database(lone_database)
    await db.open(min_size=1, max_size=1)
    held = db.connection()
    conn = await held.__aenter__()
    waiter = asyncio.create_task(_pid_of_next(db))
    await asyncio.sleep(0.05)
    return db, held, conn, waiter


async def test_a_connection_handed_to_a_waiter_cancelled_as_the_pool_closes_is_closed(
    lone_database: str,
) -> None:
    db, held, conn, waiter = await one_held_one_waiting(lone_database)
    await held.__aexit__(None, None, None)  # handed to the waiter, which has not run yet
    waiter.cancel()
    await db.close()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await eventually(conn.is_closed)


async def test_a_connection_the_server_ended_is_replaced(
    database: Database, lone_database: str
) -> None:
    async with database.connection() as conn:
        ended = await backend(conn)
    killer = await asyncpg.connect(lone_database)
    await killer.execute("SELECT pg_terminate_backend($1)", ended)
    await killer.close()
    await asyncio.sleep(0.2)  # the pool's connection has seen its end
    async with database.connection() as conn:
        assert await backend(conn) != ended


async def test_a_statement_on_a_connection_that_broke_is_unavailable(
    database: Database,
) -> None:
    with pytest.raises(Unavailable):
        await _broken_in_the_block(database)
    async with database.connection() as conn:
        assert await conn.fetchval("SELECT 1") == 1


async def _broken_in_the_block(database: Database) -> None:
    async with database.connection() as conn:
        conn.terminate()
        await conn.fetchval("SELECT 1")


async def test_a_database_that_cannot_be_reached_is_unavailable() -> None:
    db = Database("postgresql://postgres@127.0.0.1:1/nowhere")
    with pytest.raises(Unavailable):
        await db.open()


async def test_a_failed_connect_gives_its_room_to_the_next_request(lone_database: str) -> None:
    tries: list[str] = []

    async def flaky() -> Connection:
        tries.append("connect")
        if len(tries) == 1:
            raise Unavailable("database unreachable")
        return await asyncpg.connect(lone_database)

    pool = Pool(flaky, 0, 1)
    with pytest.raises(Unavailable):
        await pool.acquire()
    conn = await asyncio.wait_for(pool.acquire(), 5)  # the failed one holds no place
    pool.release(conn, reusable=True)
    await pool.close()  # waits for the idle ones to close
    assert conn.is_closed()


async def test_closing_answers_waiters_and_closes_connections_as_they_come_back(
    lone_database: str,
) -> None:
    db, held, conn, waiter = await one_held_one_waiting(lone_database)
    await db.close()
    with pytest.raises(Unavailable):
        await waiter
    await held.__aexit__(None, None, None)
    assert await eventually(conn.is_closed)
    with pytest.raises(Unavailable):
        async with db.connection():
            pass


async def test_connections_idle_too_long_are_closed_down_to_min_size(
    lone_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(lone_database)
    await db.open(min_size=1, max_size=3)
    blocks = [db.connection() for _ in range(3)]
    conns = [await block.__aenter__() for block in blocks]
    monkeypatch.setattr(db_module, "IDLE_S", 0.0)
    for block in blocks:
        await asyncio.sleep(0.01)
        await block.__aexit__(None, None, None)
    # each give-back closed the one idle longest, down to one
    assert await eventually(lambda: sum(not c.is_closed() for c in conns) == 1)
    async with db.connection() as conn:
        assert conn is conns[2]
    await db.close()
