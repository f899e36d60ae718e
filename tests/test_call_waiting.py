"""GET /calls/{id}?wait=S: answered as soon as the call moves on, whichever instance moved it,
through PostgreSQL's NOTIFY rather than polling; and still answered when listening fails."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from app import db as app_db
from app.calls import history
from app.db import LISTENER_NAME, Database
from tests.conftest import running_app
from tests.flows import Auth, Flow, refund_args

HANG_S = 8.0
"""Far more than any answer takes, so a busy machine cannot fail these tests by timing:
they assert what a waiter is answered and how many reads it took; how late the answers are
is measured by ``bench/waits.py``."""
LISTENERS = (
    "SELECT {} FROM pg_stat_activity"
    f" WHERE application_name = '{LISTENER_NAME}' AND datname = current_database()"
)


@pytest.fixture
def flow(client: httpx.AsyncClient, auth: Auth) -> Flow:
    return Flow(client, auth)


async def awaiting_approval(flow: Flow) -> tuple[str, str]:
    """A refund waiting for its approver: (call_id, snapshot_hash)."""
    proposal = await flow.propose("issue_refund", refund_args())
    preview = await flow.dry_run(proposal["call_id"])
    return proposal["call_id"], preview["snapshot_hash"]


async def timed_get(
    client: httpx.AsyncClient, url: str, auth: Auth
) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await client.get(url, headers=auth(), timeout=30)
    return response, time.monotonic() - started


async def wait_for_listeners(db: asyncpg.Connection, count: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        listening = await db.fetchval(LISTENERS.format("count(*)"))
        if listening >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("toolgate is not listening")


async def approve_soon(flow: Flow, call_id: str, snapshot_hash: str, after_s: float) -> float:
    await asyncio.sleep(after_s)
    response = await flow.approve(call_id, snapshot_hash)
    assert response.status_code == 200, response.text
    return time.monotonic()


async def test_a_waiter_on_one_instance_wakes_when_another_instance_approves(
    flow: Flow, env: dict[str, str], auth: Auth, db: asyncpg.Connection
) -> None:
    call_id, snapshot_hash = await awaiting_approval(flow)
    async with running_app(env) as other:
        await wait_for_listeners(db, 2)
        waiter = asyncio.create_task(timed_get(other, f"/calls/{call_id}?wait=20", auth))
        approved_at = await approve_soon(flow, call_id, snapshot_hash, 0.5)
        response, elapsed = await waiter
        answered_at = time.monotonic()
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "approved"
    assert answered_at - approved_at < 1.0
    assert 0.5 <= elapsed < 5


async def test_a_call_that_is_not_waiting_is_answered_at_once(
    flow: Flow, client: httpx.AsyncClient, auth: Auth
) -> None:
    proposal = await flow.propose("get_order", {"order_id": "ord_1"})
    response, elapsed = await timed_get(client, f"/calls/{proposal['call_id']}?wait=30", auth)
    assert (response.status_code, response.json()["state"]) == (200, "proposed")
    assert elapsed < 1.0


async def test_a_call_still_waiting_is_answered_when_the_time_is_up(
    flow: Flow, client: httpx.AsyncClient, auth: Auth
) -> None:
    call_id, _ = await awaiting_approval(flow)
    response, elapsed = await timed_get(client, f"/calls/{call_id}?wait=0.6", auth)
    assert (response.status_code, response.json()["state"]) == (200, "awaiting_approval")
    assert 0.6 <= elapsed < 2.0


@pytest.mark.parametrize("wait", ["0", "-1", "60.5", "nan", "inf", "soon"])
async def test_a_wait_outside_zero_to_sixty_seconds_is_an_invalid_request(
    flow: Flow, client: httpx.AsyncClient, auth: Auth, wait: str
) -> None:
    call_id, _ = await awaiting_approval(flow)
    response = await client.get(f"/calls/{call_id}?wait={wait}", headers=auth())
    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")
    if wait == "soon":  # not a number: the query, not a body, is what is malformed
        assert response.json()["detail"] == "the request is malformed"
        assert response.json()["errors"][0]["path"] == "/wait"


async def test_waiting_on_someone_elses_call_is_not_found(
    flow: Flow, client: httpx.AsyncClient, auth: Auth
) -> None:
    call_id, _ = await awaiting_approval(flow)
    started = time.monotonic()
    response = await client.get(f"/calls/{call_id}?wait=5", headers=auth("carol", "globex"))
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert time.monotonic() - started < 1.0


async def test_waiters_survive_a_dropped_listening_connection(
    flow: Flow, env: dict[str, str], auth: Auth, db: asyncpg.Connection
) -> None:
    call_id, snapshot_hash = await awaiting_approval(flow)
    async with running_app(env) as other:
        await wait_for_listeners(db, 2)
        waiter = asyncio.create_task(timed_get(other, f"/calls/{call_id}?wait=20", auth))
        await asyncio.sleep(0.2)
        await db.execute(LISTENERS.format("pg_terminate_backend(pid)"))
        await asyncio.sleep(0.2)
        assert not waiter.done()  # woken to read again, still waiting
        await wait_for_listeners(db, 2)
        approved_at = await approve_soon(flow, call_id, snapshot_hash, 0.1)
        response, _ = await waiter
        answered_at = time.monotonic()
    assert response.json()["state"] == "approved"
    assert answered_at - approved_at < 1.0


@pytest.fixture
async def small_pool(app: Any, database_url: str) -> AsyncIterator[None]:
    """The test app on a pool of three connections, so that reads queue for it."""
    state = app.state.toolgate
    small, usual = Database(database_url), state.db
    await small.open(min_size=1, max_size=3)
    state.db = small
    try:
        yield
    finally:
        state.db = usual
        await small.close()


async def test_many_waiters_on_a_small_pool_share_their_reads_and_answer_in_time(
    flow: Flow, auth: Auth, small_pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each waiter once read the call at its start and again when its time was up: with
    thousands of them, the reads at the deadline queued for the pool and answered many
    seconds late. Now a waiter whose time is up answers from its read, and concurrent reads
    of one call are one read."""
    call_id, _ = await awaiting_approval(flow)
    reads = 0
    record = history._record

    async def counted(*args: Any) -> Any:
        nonlocal reads
        reads += 1
        return await record(*args)

    monkeypatch.setattr(history, "_record", counted)
    waiters = [timed_get(flow.client, f"/calls/{call_id}?wait=2", auth) for _ in range(300)]
    answered = await asyncio.gather(*waiters)
    assert {r.json()["state"] for r, _ in answered} == {"awaiting_approval"}
    assert reads <= 4, reads  # a read for the first waiter, one for all who came meanwhile
    took = sorted(took for _, took in answered)
    assert took[0] >= 2, took[0]  # none answered before its time
    assert took[-1] < 2 + HANG_S, took[-1]  # the margin itself is bench/waits.py's to show


async def test_a_change_wakes_every_waiter_on_a_small_pool_with_the_new_state(
    flow: Flow, auth: Auth, small_pool: None
) -> None:
    call_id, snapshot_hash = await awaiting_approval(flow)
    waiters = [timed_get(flow.client, f"/calls/{call_id}?wait=20", auth) for _ in range(300)]
    approved_at = asyncio.create_task(approve_soon(flow, call_id, snapshot_hash, 0.5))
    answered = await asyncio.gather(*waiters)
    answered_at = time.monotonic()
    assert {r.json()["state"] for r, _ in answered} == {"approved"}
    assert answered_at - await approved_at < HANG_S  # woken by the change, not at 20 s


async def test_a_waiter_that_read_while_nobody_listened_reads_again_when_its_time_is_up(
    flow: Flow,
    env: dict[str, str],
    auth: Auth,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change made while the listening connection is down is announced to nobody: a
    waiter that read the call then must not answer that read as the call's state."""
    call_id, snapshot_hash = await awaiting_approval(flow)
    async with running_app(env) as other:
        await wait_for_listeners(db, 2)
        monkeypatch.setattr(app_db, "LISTEN_RETRY_S", 4.0)  # down for 4 s once dropped
        await db.execute(LISTENERS.format("pg_terminate_backend(pid)"))
        await asyncio.sleep(0.3)
        waiter = asyncio.create_task(timed_get(other, f"/calls/{call_id}?wait=1.5", auth))
        await approve_soon(flow, call_id, snapshot_hash, 0.3)  # nobody hears it
        response, _ = await waiter
        assert response.json()["state"] == "approved"
        await wait_for_listeners(db, 2)


async def test_a_waiter_whose_call_cannot_be_read_in_time_is_unavailable_not_late(
    flow: Flow, app: Any, auth: Auth, small_pool: None
) -> None:
    call_id, _ = await awaiting_approval(flow)
    pool = app.state.toolgate.db
    async with pool.connection(), pool.connection(), pool.connection():  # all three held
        response, took = await timed_get(flow.client, f"/calls/{call_id}?wait=0.5", auth)
    assert (response.status_code, response.json()["code"]) == (503, "unavailable")
    assert 0.5 <= took < 0.5 + HANG_S, took  # not held until the pool frees
