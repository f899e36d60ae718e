"""Group commit (``app.db.GroupCommit``): its numbered rules one by one against a fake
connection, in milliseconds; then on real PostgreSQL, concurrent callers of one statement
sharing a transaction, a faulty statement failing alone, connection trouble failing every
caller with an error of its own; and through the API, parallel reads, proposals and
mutations (whose single statements commit together) each storing their own rows, one key
still having one effect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from app.db import MAX_GROUP, Database, GroupCommit
from app.errors import Unavailable
from tests.conftest import Providers
from tests.flows import Flow, new_key

TICKET = {"subject": "Broken", "body": "It broke.", "order_id": "ord_1"}

INSERT = "WITH added AS (INSERT INTO batch_rows VALUES ($1) RETURNING 1) SELECT count(*) FROM added"
WHO = (
    "WITH added AS (INSERT INTO batch_rows VALUES ($1) RETURNING 1)"
    " SELECT pg_current_xact_id()::text FROM added"
)


class Fake:
    """A connection that records what it was sent: ``fetchmany`` answers one row per
    statement (the first argument), unless told to refuse (a statement whose first argument
    is negative) or to lose a row; ``fetchval`` answers the first argument, or raises for a
    negative one."""

    def __init__(self) -> None:
        self.groups: list[list[Any]] = []
        self.alone: list[Any] = []
        self.lose_a_row = False
        self.down = False

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Fake]:
        if self.down:
            raise Unavailable("database unavailable")
        yield self

    async def fetchmany(self, query: str, args: Iterable[Sequence[Any]]) -> list[Any]:
        values = [a[0] for a in args]
        self.groups.append(values)
        if any(v < 0 for v in values):
            raise ValueError("refused: nothing of the group is stored")
        return [(v,) for v in values[: -1 if self.lose_a_row else None]]

    async def fetchval(self, query: str, *args: Any) -> Any:
        self.alone.append(args[0])
        if args[0] < 0:
            raise ValueError(f"statement {args[0]} refused")
        return args[0]


def commits(fake: Fake) -> GroupCommit:
    return GroupCommit(fake.connect, "statement")


async def test_rule_1_a_lone_statement_goes_at_once_and_later_ones_wait_for_the_next_group() -> (
    None
):
    fake = Fake()
    group = commits(fake)
    first = asyncio.create_task(group.commit((0,)))
    await asyncio.sleep(0)  # the writer started with the one statement queued
    rest = [asyncio.create_task(group.commit((i,))) for i in range(1, 4)]
    assert await asyncio.gather(first, *rest) == [0, 1, 2, 3]
    assert (fake.alone, fake.groups) == ([0], [[1, 2, 3]])


async def test_rule_2_a_group_is_one_round_trip_whose_rows_go_to_their_own_callers() -> None:
    fake = Fake()
    group = commits(fake)
    assert await asyncio.gather(*(group.commit((i,)) for i in range(5))) == [0, 1, 2, 3, 4]
    assert fake.groups == [[0, 1, 2, 3, 4]]


async def test_rule_3_a_group_holds_at_most_the_cap_and_the_rest_goes_next() -> None:
    fake = Fake()
    group = commits(fake)
    results = await asyncio.gather(*(group.commit((i,)) for i in range(MAX_GROUP + 10)))
    assert results == list(range(MAX_GROUP + 10))
    assert [len(g) for g in fake.groups] == [MAX_GROUP, 10]


async def test_rule_4_a_group_without_one_row_per_statement_fails_every_caller() -> None:
    fake = Fake()
    fake.lose_a_row = True
    group = commits(fake)
    results = await asyncio.gather(*(group.commit((i,)) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)
    assert fake.alone == []  # not run again: the group may be stored


async def test_rule_5_a_refused_group_runs_again_one_by_one_so_only_the_faulty_one_fails() -> None:
    fake = Fake()
    group = commits(fake)
    results = await asyncio.gather(
        *(group.commit((i,)) for i in (1, -2, 3)), return_exceptions=True
    )
    assert (results[0], results[2]) == (1, 3)
    assert isinstance(results[1], ValueError)
    assert (fake.groups, fake.alone) == ([[1, -2, 3]], [1, -2, 3])


async def test_rule_6_connection_trouble_fails_each_caller_with_an_error_of_its_own() -> None:
    fake = Fake()
    fake.down = True
    group = commits(fake)
    results = await asyncio.gather(*(group.commit((i,)) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)
    assert len({id(r) for r in results}) == 3


async def test_rule_7_a_cancelled_caller_is_not_woken_and_the_others_are() -> None:
    fake = Fake()
    group = commits(fake)
    callers = [asyncio.create_task(group.commit((i,))) for i in range(4)]
    await asyncio.sleep(0)
    callers[2].cancel()
    done = await asyncio.gather(*callers, return_exceptions=True)
    assert isinstance(done[2], asyncio.CancelledError)
    assert [done[i] for i in (0, 1, 3)] == [0, 1, 3]


async def test_rule_8_a_group_runs_in_the_order_of_the_rows_its_statements_lock() -> None:
    fake = Fake()
    group = commits(fake)
    first = asyncio.create_task(group.commit((0,)))
    await asyncio.sleep(0)
    orders = ["run_c", "run_a", "", "run_b", "run_a"]
    rest = [group.commit((i,), order) for i, order in enumerate(orders, start=1)]
    assert await asyncio.gather(first, *rest) == [0, 1, 2, 3, 4, 5]  # each its own row
    assert fake.groups == [[3, 2, 5, 4, 1]]  # "", run_a (as queued), run_a, run_b, run_c


@pytest.fixture
async def facade(lone_database: str) -> AsyncIterator[Database]:
    db = Database(lone_database)
    await db.open(min_size=1, max_size=4)
    conn = await asyncpg.connect(lone_database)
    await conn.execute("CREATE TABLE batch_rows (id int PRIMARY KEY)")
    await conn.close()
    yield db
    await db.close()


async def stored(db: Database) -> list[int]:
    async with db.connection() as conn:
        return [r["id"] for r in await conn.fetch("SELECT id FROM batch_rows ORDER BY id")]


async def test_concurrent_callers_share_one_transaction(facade: Database) -> None:
    first = await facade.group_commit(WHO, 0)  # alone: a batch of one, waiting for none
    together = await asyncio.gather(*(facade.group_commit(WHO, i) for i in range(1, 21)))
    assert len(set(together)) == 1
    assert together[0] != first
    assert await stored(facade) == list(range(21))


async def test_a_faulty_statement_fails_alone(facade: Database) -> None:
    results = await asyncio.gather(
        *(facade.group_commit(INSERT, i) for i in (1, 2, 1, 3)), return_exceptions=True
    )
    assert [results[i] for i in (0, 1, 3)] == [1, 1, 1]
    assert isinstance(results[2], asyncpg.UniqueViolationError)
    assert await stored(facade) == [1, 2, 3]


async def test_a_cancelled_caller_leaves_the_others_waiting(facade: Database) -> None:
    callers = [asyncio.create_task(facade.group_commit(INSERT, i)) for i in range(5)]
    await asyncio.sleep(0)  # all five queued
    callers[1].cancel()
    done = await asyncio.gather(*callers, return_exceptions=True)
    assert isinstance(done[1], asyncio.CancelledError)
    assert [done[i] for i in (0, 2, 3, 4)] == [1, 1, 1, 1]
    assert await stored(facade) == [0, 1, 2, 3, 4]  # a statement sent is not taken back


async def test_connection_trouble_fails_each_caller_with_its_own_error(
    lone_database: str,
) -> None:
    db = Database(lone_database)
    await db.open(min_size=1, max_size=2)
    await db.close()  # every checkout now fails
    errors = await asyncio.gather(
        *(db.group_commit("SELECT $1::int", i) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(e, Unavailable) for e in errors)
    assert len({id(e) for e in errors}) == 3


async def test_parallel_reads_and_proposals_each_store_their_call_and_audit_row(
    flow: Flow, db: asyncpg.Connection
) -> None:
    reads = [flow.execute("get_order", {"order_id": "ord_1"}, None) for _ in range(16)]
    proposals = [
        flow.post("/propose", {"tool": "get_order", "arguments": {"order_id": "ord_1"}})
        for _ in range(4)
    ]
    answers = await asyncio.gather(*reads, *proposals)
    assert [a.status_code for a in answers] == [200] * 20
    call_ids = {a.json()["call_id"] for a in answers}
    assert len(call_ids) == 20
    stored = await db.fetch("SELECT id, state FROM calls")
    assert {r["id"] for r in stored} == call_ids
    audited = await db.fetch("SELECT call_id, event FROM audit_events")
    assert sorted(r["event"] for r in audited) == ["executed"] * 16 + ["proposed"] * 4
    assert {r["call_id"] for r in audited} == call_ids


async def test_parallel_mutations_with_one_key_have_one_effect_and_others_each_theirs(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    key = new_key()
    before = (await providers.stats())["effects_by_path"].get("/support/tickets", 0)
    same = await asyncio.gather(*(flow.execute("create_ticket", TICKET, key) for _ in range(12)))
    assert {r.status_code for r in same} <= {200, 409}
    assert all(r.json()["code"] == "idempotency_in_flight" for r in same if r.status_code == 409)
    others = await asyncio.gather(
        *(flow.execute("create_ticket", TICKET, new_key()) for _ in range(12))
    )
    assert [r.status_code for r in others] == [200] * 12
    after = (await providers.stats())["effects_by_path"].get("/support/tickets", 0)
    assert after - before == 13
    assert await db.fetchval("SELECT count(*) FROM executions WHERE state = 'succeeded'") == 13
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'executed'") == 13
