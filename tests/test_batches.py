"""``Database.fetchval``: concurrent callers of one statement share a transaction, a faulty
statement fails alone, connection trouble fails every caller with an error of its own; and
through the API, parallel reads, proposals and mutations (whose single statements commit
in batches) each store their own rows, and one key still has one effect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.db import Database
from app.errors import Unavailable
from tests.conftest import Providers
from tests.flows import Flow, new_key

TICKET = {"subject": "Broken", "body": "It broke.", "order_id": "ord_1"}

INSERT = "WITH added AS (INSERT INTO batch_rows VALUES ($1) RETURNING 1) SELECT count(*) FROM added"
WHO = (
    "WITH added AS (INSERT INTO batch_rows VALUES ($1) RETURNING 1)"
    " SELECT pg_current_xact_id()::text FROM added"
)


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
    first = await facade.fetchval(WHO, 0)  # alone: a batch of one, waiting for none
    together = await asyncio.gather(*(facade.fetchval(WHO, i) for i in range(1, 21)))
    assert len(set(together)) == 1
    assert together[0] != first
    assert await stored(facade) == list(range(21))


async def test_a_faulty_statement_fails_alone(facade: Database) -> None:
    results = await asyncio.gather(
        *(facade.fetchval(INSERT, i) for i in (1, 2, 1, 3)), return_exceptions=True
    )
    assert [results[i] for i in (0, 1, 3)] == [1, 1, 1]
    assert isinstance(results[2], asyncpg.UniqueViolationError)
    assert await stored(facade) == [1, 2, 3]


async def test_a_cancelled_caller_leaves_the_others_waiting(facade: Database) -> None:
    callers = [asyncio.create_task(facade.fetchval(INSERT, i)) for i in range(5)]
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
        *(db.fetchval("SELECT $1::int", i) for i in range(3)), return_exceptions=True
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
