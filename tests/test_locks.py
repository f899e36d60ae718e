"""PostgreSQL advisory locks (no Redis configured) through the lock facade, against the real
database: what several processes on one database rely on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

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
