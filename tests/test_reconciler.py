"""Open execution records are resolved in the background, not only on a client's retry.

The first test stops a PostgreSQL server of its own while the provider is acting: the
client must hear 504 with the operation id (never 503, "nothing ran"), and once the server
is back the reconciler, with no client involved, finishes the record from the provider's
reconcile endpoint. The others call one pass directly, on a database of their own, to pin
down what a pass does with records it cannot finish and what it leaves alone.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.calls import mutation, reconciler
from app.db import Lock
from app.state import AppState
from tests.conftest import ROOT, OwnPostgres, Providers, running_app
from tests.flows import Auth, Flow, new_key, refund_args

REFUNDS = "/billing/refunds"
TICKETS = "/support/tickets"
TIMEOUT_S = 3


async def until(check: Callable[[], Awaitable[Any]], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while not (value := await check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)
    return value


async def effects(providers: Providers, path: str = REFUNDS) -> int:
    return (await providers.stats())["effects_by_path"].get(path, 0)  # type: ignore[no-any-return]


async def sent(providers: Providers, method: str, path: str) -> list[dict[str, Any]]:
    return [r for r in await providers.requests() if (r["method"], r["path"]) == (method, path)]


@pytest.fixture
def slow_catalog(tmp_path: Path) -> Path:
    """The demo catalog with 3 s provider timeouts: long enough to stop a server mid-call."""
    directory = tmp_path / "catalog"
    directory.mkdir()
    text = (ROOT / "catalog" / "demo.yaml").read_text()
    (directory / "demo.yaml").write_text(text.replace("timeout_s: 5", f"timeout_s: {TIMEOUT_S}"))
    return directory


@pytest.mark.parametrize(
    "stall_s", [1.5, TIMEOUT_S + 1.5], ids=["provider_answered", "provider_timed_out"]
)
async def test_a_database_lost_mid_call_is_a_504_and_the_reconciler_finishes_the_record(
    own_postgres: OwnPostgres,
    env: dict[str, str],
    auth: Auth,
    providers: Providers,
    slow_catalog: Path,
    monkeypatch: pytest.MonkeyPatch,
    stall_s: float,
) -> None:
    """The refund happens while PostgreSQL is down: storing its outcome (or, past the
    timeout, marking it unknown) fails. Nobody retries; the reconciler resolves it."""
    url = await own_postgres.database("toolgate")
    monkeypatch.setattr(reconciler, "EVERY_S", 0.2)
    app_env = {**env, "TOOLGATE_DATABASE_URL": url, "TOOLGATE_CATALOG": str(slow_catalog)}
    db = await asyncpg.connect(url)
    try:
        async with running_app(app_env) as client:
            flow = Flow(client, auth)
            _, approval_id = await flow.approved_refund()
            await providers.fault(REFUNDS, "stall_after_effect", seconds=stall_s)
            key = new_key()
            refund = asyncio.create_task(
                flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
            )
            await until(lambda: effects(providers), 10, "the provider never saw the refund")
            await db.close()
            await own_postgres.stop()
            response = await refund
            assert response.status_code == 504, response.text
            assert response.headers["content-type"] == "application/problem+json"
            problem = response.json()
            assert (problem["code"], problem["status"]) == ("provider_timeout", "unknown")
            operation_id, call_id = problem["operation_id"], problem["call_id"]
            assert operation_id.startswith("op_")
            assert call_id.startswith("call_")
            assert await effects(providers) == 1

            await own_postgres.start()
            db = await asyncpg.connect(url)

            async def finished() -> str | None:
                state = await db.fetchval(
                    "SELECT state FROM executions WHERE operation_id = $1", operation_id
                )
                return state if state in ("succeeded", "failed") else None

            wait_s = TIMEOUT_S + mutation.LOCK_MARGIN_S + 15
            assert await until(finished, wait_s, "the reconciler never finished it") == "succeeded"
            rows = await db.fetch(
                "SELECT event, actor, tenant, outcome FROM audit_events WHERE call_id = $1"
                " AND event IN ('reconciled', 'executed', 'failed', 'replayed') ORDER BY seq",
                call_id,
            )
            assert [r["event"] for r in rows] == ["reconciled"]
            assert (rows[0]["actor"], rows[0]["tenant"]) == ("alice", "acme")
            outcome = json.loads(rows[0]["outcome"])
            assert (outcome["status"], outcome["provider_status"]) == ("succeeded", 201)
            asked = await sent(providers, "GET", f"{REFUNDS}/operations/{operation_id}")
            assert asked, "the reconciler did not ask the provider"
            for request in asked:
                headers = request["headers"]
                assert (headers["X-Toolgate-Actor"], headers["X-Toolgate-Tenant"]) == (
                    "alice",
                    "acme",
                )
                assert headers["X-Toolgate-Call-Id"] == call_id
            assert len(await sent(providers, "POST", REFUNDS)) == 1
            assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == (
                "succeeded"
            )
            stored = json.loads(await db.fetchval("SELECT response FROM executions"))

            replay = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
            assert replay.status_code == 200, replay.text
            assert replay.headers["Idempotent-Replayed"] == "true"
            assert replay.json() == {**stored, "replayed": True}
            assert (replay.json()["status"], replay.json()["provider_status"]) == ("succeeded", 201)
            assert replay.json()["operation_id"] == operation_id
            assert replay.json()["result"]["amount"] == 150.0
            assert await effects(providers) == 1
    finally:
        await db.close()


@pytest.fixture
async def lone_app(
    env: dict[str, str], lone_database: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """An app on a database of its own whose background passes never come round: the test
    runs each pass itself."""
    monkeypatch.setattr(reconciler, "EVERY_S", 3600.0)
    async with running_app({**env, "TOOLGATE_DATABASE_URL": lone_database}) as client:
        yield client


def state_of(client: httpx.AsyncClient) -> AppState:
    return client._transport.app.state.toolgate  # type: ignore[attr-defined,no-any-return]


async def unknown_record(flow: Flow, providers: Providers, tool: str) -> tuple[str, str]:
    """An execution the provider never received (a 500 before any effect): ``unknown``.
    Returns its tool's path and the Idempotency-Key."""
    if tool == "issue_refund":
        _, approval_id = await flow.approved_refund()
        args: dict[str, Any] = {**refund_args(), "approval_id": approval_id}
        path = REFUNDS
    else:
        args, path = {"subject": "s", "body": "b"}, TICKETS
    await providers.fault(path, "status_500")
    key = new_key()
    first = await execute(flow, tool, args, key)
    assert (first.status_code, first.json()["status"]) == (504, "unknown"), first.text
    return path, key


async def execute(flow: Flow, tool: str, args: dict[str, Any], key: str) -> httpx.Response:
    extra = {"approval_id": args["approval_id"]} if "approval_id" in args else {}
    arguments = {k: v for k, v in args.items() if k != "approval_id"}
    return await flow.execute(tool, arguments, key, **extra)


async def failed_rows(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'failed'"))


@pytest.mark.parametrize(
    "tool", ["issue_refund", "create_ticket"], ids=["provider_says_404", "no_reconcile_endpoint"]
)
async def test_a_stale_in_flight_record_nobody_can_finish_becomes_unknown_and_is_not_resent(
    lone_app: httpx.AsyncClient,
    lone_database: str,
    auth: Auth,
    providers: Providers,
    tool: str,
) -> None:
    flow = Flow(lone_app, auth)
    state = state_of(lone_app)
    db = await asyncpg.connect(lone_database)
    try:
        path, key = await unknown_record(flow, providers, tool)
        before = await failed_rows(db)
        # As a worker that died mid-call leaves it, long ago.
        await db.execute(
            "UPDATE executions SET state = 'in_flight', updated_at = now() - interval '1 hour'"
        )
        assert await reconciler.reconcile_stale(state) == 1
        assert await db.fetchval("SELECT state FROM executions") == "unknown"
        assert await failed_rows(db) == before + 1
        posted = len(await sent(providers, "POST", path))
        assert posted == 1, "the pass re-sent the mutation"

        await db.execute("UPDATE executions SET updated_at = now() - interval '1 hour'")
        assert await reconciler.reconcile_stale(state) == 1
        assert await failed_rows(db) == before + 1, "an unknown record was audited twice"
        assert await db.fetchval(
            "SELECT updated_at > now() - interval '1 minute' FROM executions"
        ), "a record left open is postponed"
        assert await reconciler.reconcile_stale(state) == 0
        assert len(await sent(providers, "POST", path)) == 1

        args: dict[str, Any] = {"subject": "s", "body": "b"}
        if tool == "issue_refund":
            approval = await db.fetchval("SELECT approval_id FROM executions")
            args = {**refund_args(), "approval_id": approval}
        retry = await execute(flow, tool, args, key)
        assert retry.status_code == 200, retry.text
        assert retry.json()["status"] == "succeeded"
        assert await effects(providers, path) == 1
    finally:
        await db.close()


async def test_a_pass_leaves_alone_a_key_at_work_and_runs_one_at_a_time(
    lone_app: httpx.AsyncClient, lone_database: str, auth: Auth, providers: Providers
) -> None:
    flow = Flow(lone_app, auth)
    state = state_of(lone_app)
    db = await asyncpg.connect(lone_database)
    try:
        await unknown_record(flow, providers, "issue_refund")
        await db.execute(
            "UPDATE executions SET state = 'in_flight', updated_at = now() - interval '1 hour'"
        )
        record = await db.fetchrow("SELECT tenant, actor, idempotency_key FROM executions")
        assert record is not None
        lock = mutation.lock_name(record["tenant"], record["actor"], record["idempotency_key"])
        async with state.locks.hold(lock, 30) as held:
            assert held
            assert await reconciler.reconcile_stale(state) == 1
        assert await db.fetchval("SELECT state FROM executions") == "in_flight"

        other = await asyncpg.connect(lone_database)
        try:
            await other.execute("SELECT pg_advisory_lock($1)", Lock.RECONCILER)
            assert await reconciler.reconcile_stale(state) is None
            assert await db.fetchval("SELECT state FROM executions") == "in_flight"
            await other.execute("SELECT pg_advisory_unlock($1)", Lock.RECONCILER)
        finally:
            await other.close()
        assert await reconciler.reconcile_stale(state) == 1
        assert await db.fetchval("SELECT state FROM executions") == "unknown"
        assert len(await sent(providers, "POST", REFUNDS)) == 1
    finally:
        await db.close()


async def test_a_record_whose_resolution_fails_is_postponed_and_the_pass_goes_on(
    lone_app: httpx.AsyncClient,
    lone_database: str,
    auth: Auth,
    providers: Providers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One record that fails unexpectedly (a bug, an answer nothing foresaw) must not stop
    every later pass at the same place: it goes to the back of the queue, and the records
    after it are still resolved."""
    flow = Flow(lone_app, auth)
    state = state_of(lone_app)
    db = await asyncpg.connect(lone_database)
    try:
        await unknown_record(flow, providers, "create_ticket")
        await unknown_record(flow, providers, "create_ticket")
        await db.execute("UPDATE executions SET state = 'in_flight'")
        poison, healthy = await db.fetch(
            "SELECT operation_id FROM executions ORDER BY operation_id"
        )
        for age, row in (("2 hours", poison), ("1 hour", healthy)):
            await db.execute(
                f"UPDATE executions SET updated_at = now() - interval '{age}'"
                " WHERE operation_id = $1",
                row["operation_id"],
            )
        opened = reconciler._opened

        def failing(*args: Any) -> mutation.OpenExecution:
            if args[3].operation_id == poison["operation_id"]:
                raise RuntimeError("a record nothing foresaw")
            return opened(*args)

        monkeypatch.setattr(reconciler, "_opened", failing)
        assert await reconciler.reconcile_stale(state) == 2
        rows = await db.fetch("SELECT operation_id, state FROM executions")
        states = {r["operation_id"]: r["state"] for r in rows}
        assert states == {poison["operation_id"]: "in_flight", healthy["operation_id"]: "unknown"}
        assert await db.fetchval(
            "SELECT updated_at > now() - interval '1 minute' FROM executions"
            " WHERE operation_id = $1",
            poison["operation_id"],
        ), "the failing record is postponed"
        assert len(await sent(providers, "POST", TICKETS)) == 2
    finally:
        await db.close()
