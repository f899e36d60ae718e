"""PostgreSQL advisory locks (no Redis configured) through the lock facade, against the real
database: what several processes on one database rely on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.errors import Unavailable
from app.locks import TIMEOUT_S as LOCKS_TIMEOUT_S
from app.locks import Locks


@pytest.fixture
async def two_processes(database_url: str) -> AsyncIterator[tuple[Locks, Locks]]:
    """Two facades with pools of their own: as two worker processes have."""
    first, second = Locks(None, "", database_url), Locks(None, "", database_url)
    await first.open()
    await second.open()
    yield first, second
    await first.close()
    await second.close()


async def test_a_held_lock_is_refused_to_another_process_until_released(
    two_processes: tuple[Locks, Locks],
) -> None:
    first, second = two_processes
    assert first.backend == "postgres"
    async with first.hold("idem:a", 5) as held:
        assert held
        async with second.hold("idem:a", 5) as other:
            assert not other
        async with first.hold("idem:a", 5) as same_process:
            assert not same_process, "another request in the same process is refused too"
        async with second.hold("idem:b", 5) as another_name:
            assert another_name
    async with second.hold("idem:a", 5) as after:
        assert after


async def test_a_lock_is_released_when_its_holder_fails(
    two_processes: tuple[Locks, Locks],
) -> None:
    first, second = two_processes

    async def failing_work() -> None:
        async with first.hold("idem:c", 5) as held:
            assert held
            raise RuntimeError("the work failed")

    with pytest.raises(RuntimeError):
        await failing_work()
    for _ in range(3):  # whichever pooled connection comes next holds nothing
        async with first.hold("idem:c", 5) as again, second.hold("idem:c", 5) as other:
            assert (again, other) == (True, False)


async def test_many_parallel_holders_of_one_name_get_it_once(
    two_processes: tuple[Locks, Locks],
) -> None:
    first, second = two_processes
    gate = asyncio.Event()

    async def try_hold(locks: Locks) -> bool:
        async with locks.hold("idem:d", 5) as held:
            await gate.wait()
            return held

    tasks = [asyncio.create_task(try_hold(locks)) for locks in (first, second) * 8]
    await asyncio.sleep(0.5)
    gate.set()
    assert sorted(await asyncio.gather(*tasks)) == [False] * 15 + [True]


async def test_a_redis_that_stops_answering_is_unavailable_within_seconds() -> None:
    """A lock server that takes connections and never answers (a hung Redis, a dropped
    route): taking a lock must fail closed soon, and readiness say no, not wait forever."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    locks = Locks(f"redis://127.0.0.1:{port}/0", "", "postgresql://unused")
    try:
        started = asyncio.get_running_loop().time()

        async def take() -> None:
            async with asyncio.timeout(20), locks.hold("idem:d", 5):
                pass

        with pytest.raises(Unavailable):
            await take()
        async with asyncio.timeout(20):
            assert await locks.ping() is False
        assert asyncio.get_running_loop().time() - started < 3 * LOCKS_TIMEOUT_S + 1
    finally:
        await locks.close()
        server.close()
        await server.wait_closed()
