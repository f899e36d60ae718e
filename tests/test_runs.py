"""Runs: budgets that stop agent loops, on real PostgreSQL and providers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import httpx

from app.auth.principal import Principal
from app.runs import store as runs_store
from app.runs.models import RunRow
from app.runs.service import OwnRuns
from tests.conftest import Providers
from tests.flows import Flow, new_key, refund_args


async def start_run(flow: Flow, **limits: float) -> str:
    response = await flow.post("/runs", {"task": "help a customer", "limits": limits})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "active"
    return response.json()["run_id"]  # type: ignore[no-any-return]


async def run_state(flow: Flow, run_id: str) -> dict[str, Any]:
    response = await flow.client.get(f"/runs/{run_id}", headers=flow.auth())
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def propose(flow: Flow, run_id: str, order: str = "ord_1") -> httpx.Response:
    return await flow.post(
        "/propose", {"tool": "get_order", "arguments": {"order_id": order}, "run_id": run_id}
    )


async def test_a_run_needs_no_body(flow: Flow) -> None:
    response = await flow.client.post("/runs", headers=flow.auth())
    assert response.status_code == 200, response.text
    assert response.json()["limits"]["max_calls"] == 200


async def test_requested_limits_are_capped_by_the_server(flow: Flow) -> None:
    response = await flow.post("/runs", {"limits": {"max_calls": 10**6, "max_cost": 2.5}})
    limits = response.json()["limits"]
    assert limits["max_calls"] == 200
    assert limits["max_cost"] == 2.5
    unknown = await flow.post("/runs", {"limits": {"max_calls": 5, "max_power": 1}})
    assert (unknown.status_code, unknown.json()["code"]) == (400, "invalid_request")


async def test_a_loop_past_max_calls_is_stopped_and_the_run_fails_recoverably(
    flow: Flow, db: asyncpg.Connection
) -> None:
    run_id = await start_run(flow, max_calls=3)
    for _ in range(3):
        assert (await propose(flow, run_id)).status_code == 200
    stopped = await propose(flow, run_id)
    assert (stopped.status_code, stopped.json()["code"]) == (429, "run_limit_exceeded")
    assert stopped.json()["limit"] == "max_calls"
    state = await run_state(flow, run_id)
    assert (state["status"], state["recoverable"], state["limit"]) == ("failed", True, "max_calls")
    again = await propose(flow, run_id)
    assert again.json()["code"] == "run_limit_exceeded"
    denied = await db.fetchval(
        "SELECT count(*) FROM calls WHERE run_id = $1 AND code = 'run_limit_exceeded'", run_id
    )
    assert denied == 2


async def test_running_one_call_again_and_again_counts_every_run_after_the_first(
    flow: Flow, providers: Providers
) -> None:
    """Executing a proposed call is the call its proposal counted; running it once more (a
    new key for a mutation) is another call, or one call id could loop past ``max_calls``."""
    read_run = await start_run(flow, max_calls=2)
    proposal = await propose(flow, read_run)
    call_id = proposal.json()["call_id"]
    for _ in range(2):  # the proposal's own execution (call 1), then one more (call 2)
        ran = await flow.post("/execute", {"call_id": call_id})
        assert ran.status_code == 200, ran.text
    stopped = await flow.post("/execute", {"call_id": call_id})
    assert (stopped.status_code, stopped.json()["code"]) == (429, "run_limit_exceeded")
    assert (await run_state(flow, read_run))["status"] == "failed"

    ticket_run = await start_run(flow, max_calls=2)
    ticket = await flow.post(
        "/propose",
        {"tool": "create_ticket", "arguments": {"subject": "s", "body": "b"}, "run_id": ticket_run},
    )
    call_id = ticket.json()["call_id"]
    keys = [new_key() for _ in range(3)]
    answers = [
        await flow.post("/execute", {"call_id": call_id}, headers={"Idempotency-Key": key})
        for key in keys
    ]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["code"] == "run_limit_exceeded"
    replay = await flow.post("/execute", {"call_id": call_id}, headers={"Idempotency-Key": keys[1]})
    assert replay.json()["replayed"] is True  # a replay is not another call
    assert (await providers.stats())["effects_by_path"].get("/support/tickets") == 2


async def test_parallel_runs_of_one_call_count_every_run_after_the_first(
    flow: Flow, providers: Providers
) -> None:
    """Parallel executes of one proposed call, with as many keys, are as many calls: only
    one of them is the call its proposal counted, or a loop could act past ``max_calls``
    by sending its re-runs at once."""
    ticket_run = await start_run(flow, max_calls=1)
    ticket = await flow.post(
        "/propose",
        {"tool": "create_ticket", "arguments": {"subject": "s", "body": "b"}, "run_id": ticket_run},
    )
    answers = await asyncio.gather(
        *(
            flow.post(
                "/execute",
                {"call_id": ticket.json()["call_id"]},
                headers={"Idempotency-Key": new_key()},
            )
            for _ in range(5)
        )
    )
    assert sorted(a.status_code for a in answers) == [200] + [429] * 4
    assert (await providers.stats())["effects_by_path"]["/support/tickets"] == 1
    assert (await run_state(flow, ticket_run))["counters"]["calls"] == 1

    read_run = await start_run(flow, max_calls=1)
    call_id = (await propose(flow, read_run)).json()["call_id"]
    answers = await asyncio.gather(*(flow.post("/execute", {"call_id": call_id}) for _ in range(5)))
    assert sorted(a.status_code for a in answers) == [200] + [429] * 4
    state = await run_state(flow, read_run)
    assert state["calls"][0]["state"] == "succeeded"


async def test_parallel_calls_never_overspend_max_calls(flow: Flow) -> None:
    run_id = await start_run(flow, max_calls=5)
    responses = await asyncio.gather(*(propose(flow, run_id) for _ in range(20)))
    assert sorted(r.status_code for r in responses) == [200] * 5 + [429] * 15


async def read(flow: Flow, run_id: str, order: str = "ord_1", **who: str) -> httpx.Response:
    body = {"tool": "get_order", "arguments": {"order_id": order}, "run_id": run_id}
    return await flow.post("/execute", body, who or None)


async def test_reads_in_a_run_are_admitted_within_its_limits_and_only_in_ones_own_run(
    flow: Flow,
) -> None:
    """A read in a run is admitted in one statement when nothing stops it; whatever stops
    it is still found: the run's limit under parallel reads, another user's run."""
    run_id = await start_run(flow, max_calls=5)
    responses = await asyncio.gather(*(read(flow, run_id) for _ in range(20)))
    assert sorted(r.status_code for r in responses) == [200] * 5 + [429] * 15
    assert (await run_state(flow, run_id))["status"] == "failed"  # by its max_calls
    other = await read(flow, run_id, sub="erin", roles="support")
    assert (other.status_code, other.json()["code"]) == (404, "not_found")


async def test_cost_is_charged_per_execution_never_for_proposals_or_previews(
    flow: Flow, providers: Providers
) -> None:
    run_id = await start_run(flow, max_cost=1.5)
    args = refund_args(20.0)
    for _ in range(3):
        proposal = await flow.post(
            "/propose", {"tool": "issue_refund", "arguments": args, "run_id": run_id}
        )
        await flow.dry_run(proposal.json()["call_id"])
    assert (await run_state(flow, run_id))["counters"]["cost"] == 0
    first = await flow.execute("issue_refund", args, new_key(), run_id=run_id)
    assert first.json()["status"] == "succeeded", first.text
    assert (await run_state(flow, run_id))["counters"]["cost"] == 1.0
    second = await flow.execute("issue_refund", args, new_key(), run_id=run_id)
    assert (second.status_code, second.json()["limit"]) == (429, "max_cost")
    assert (await providers.stats())["effects_by_path"]["/billing/refunds"] == 1


async def test_elapsed_time_is_a_limit(flow: Flow) -> None:
    run_id = await start_run(flow, max_seconds=1)
    assert (await propose(flow, run_id)).status_code == 200
    await asyncio.sleep(1.2)
    stopped = await propose(flow, run_id)
    assert (stopped.status_code, stopped.json()["limit"]) == (429, "max_seconds")


async def test_too_many_failures_stop_the_loop(flow: Flow, providers: Providers) -> None:
    run_id = await start_run(flow, max_failures=2)
    await providers.fault("/support/tickets", "status_500", count=2)
    for subject in ("one", "two"):
        failed = await flow.execute(
            "create_ticket", {"subject": subject, "body": "b"}, new_key(), run_id=run_id
        )
        assert failed.status_code == 504
    stopped = await flow.execute(
        "create_ticket", {"subject": "three", "body": "b"}, new_key(), run_id=run_id
    )
    assert (stopped.status_code, stopped.json()["limit"]) == (429, "max_failures")
    assert (await providers.stats())["effects"] == 0


async def test_a_repeated_failing_call_asks_for_clarification(
    flow: Flow, providers: Providers
) -> None:
    run_id = await start_run(flow, max_repeats=2)
    too_much = {"order_id": "ord_2", "amount": 50.0, "customer_id": "alice"}
    proposal = await flow.post(
        "/propose", {"tool": "issue_refund", "arguments": too_much, "run_id": run_id}
    )
    await flow.dry_run(proposal.json()["call_id"])
    for _ in range(2):
        refused = await flow.execute("issue_refund", too_much, new_key(), run_id=run_id)
        assert (refused.json()["status"], refused.json()["provider_status"]) == ("failed", 422)
    again = await flow.post(
        "/propose", {"tool": "issue_refund", "arguments": too_much, "run_id": run_id}
    )
    assert (again.status_code, again.json()["code"]) == (429, "repeated_call")
    assert (await run_state(flow, run_id))["status"] == "needs_clarification"


async def test_a_run_waiting_for_approval_says_so(flow: Flow) -> None:
    run_id = await start_run(flow)
    proposal = await flow.post(
        "/propose", {"tool": "issue_refund", "arguments": refund_args(), "run_id": run_id}
    )
    assert (await run_state(flow, run_id))["status"] == "active"
    preview = await flow.dry_run(proposal.json()["call_id"])
    assert (await run_state(flow, run_id))["status"] == "awaiting_approval"
    approval = await flow.approve(proposal.json()["call_id"], preview["snapshot_hash"])
    done = await flow.execute(
        "issue_refund",
        refund_args(),
        new_key(),
        run_id=run_id,
        approval_id=approval.json()["approval_id"],
    )
    assert done.json()["status"] == "succeeded"
    state = await run_state(flow, run_id)
    assert state["status"] == "active"
    assert state["counters"] == {
        "calls": 1,
        "cost": 1.0,
        "failures": 0,
        "seconds": state["counters"]["seconds"],
    }
    assert [c["call_id"] for c in state["calls"]] == [proposal.json()["call_id"]]


async def test_finishing_a_run(flow: Flow) -> None:
    run_id = await start_run(flow)
    other = await flow.post(
        f"/runs/{run_id}/finish", {"status": "completed"}, {"sub": "bob", "roles": "support"}
    )
    assert (other.status_code, other.json()["code"]) == (404, "not_found")
    done = await flow.post(f"/runs/{run_id}/finish", {"status": "handed_off", "reason": "human"})
    assert (done.json()["status"], done.json()["reason"]) == ("handed_off", "human")
    twice = await flow.post(f"/runs/{run_id}/finish", {"status": "completed"})
    assert twice.status_code == 400
    after = await propose(flow, run_id)
    assert after.json()["code"] == "run_limit_exceeded"


async def test_a_run_whose_call_is_past_its_approval_window_no_longer_waits(
    flow: Flow, db: asyncpg.Connection
) -> None:
    """Past its window the call cannot be approved (the inbox no longer lists it), so the
    run is not waiting for anyone."""
    run_id = await start_run(flow)
    proposal = await flow.post(
        "/propose", {"tool": "issue_refund", "arguments": refund_args(), "run_id": run_id}
    )
    await flow.dry_run(proposal.json()["call_id"])
    assert (await run_state(flow, run_id))["status"] == "awaiting_approval"
    await db.execute("UPDATE calls SET pending_until = now() - interval '1 second'")
    assert (await run_state(flow, run_id))["status"] == "active"


async def test_another_actors_run_cannot_be_used(flow: Flow, db: asyncpg.Connection) -> None:
    run_id = await start_run(flow)
    bob = {"sub": "bob", "roles": "support"}
    response = await flow.post(
        "/propose",
        {"tool": "get_order", "arguments": {"order_id": "ord_1"}, "run_id": run_id},
        bob,
    )
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert (await flow.client.get(f"/runs/{run_id}", headers=flow.auth("bob"))).status_code == 404


async def test_an_approval_of_a_runs_call_spends_that_runs_budget_whatever_the_body_says(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """Executing by ``approval_id`` alone runs the approval's call, which belongs to its run:
    leaving ``run_id`` out, or naming another run, must not spend past that run's limits."""
    run_id = await start_run(flow, max_cost=0.5)
    other_run = await start_run(flow)
    proposal = await flow.post(
        "/propose", {"tool": "issue_refund", "arguments": refund_args(), "run_id": run_id}
    )
    preview = await flow.dry_run(proposal.json()["call_id"])
    approval = await flow.approve(proposal.json()["call_id"], preview["snapshot_hash"])
    approval_id = approval.json()["approval_id"]
    elsewhere = await flow.execute(
        "issue_refund", refund_args(), new_key(), approval_id=approval_id, run_id=other_run
    )
    assert (elsewhere.status_code, elsewhere.json()["code"]) == (400, "invalid_request")
    outside = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert (outside.status_code, outside.json()["code"]) == (429, "run_limit_exceeded")
    assert outside.json()["limit"] == "max_cost"
    assert (await providers.stats())["effects"] == 0
    assert (await run_state(flow, run_id))["status"] == "failed"
    assert (await run_state(flow, other_run))["counters"]["cost"] == 0
    assert await db.fetchval("SELECT consumed_by FROM approvals WHERE id = $1", approval_id) is None


async def blocked_on_a_lock(db: asyncpg.Connection) -> None:
    """Wait until another session of this database waits for a row lock."""
    for _ in range(200):
        waiting = await db.fetchval(
            """
            SELECT count(*) FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'
            """
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing waited for the lock")


async def test_a_call_racing_the_runs_finish_is_told_how_the_run_really_ended(
    flow: Flow, db: asyncpg.Connection
) -> None:
    """A call admitted while the run is being finished must not read as a limit that was
    never reached (``max_calls``, ``failed``, recoverable): the orchestrator would retry a
    run a human handed off."""
    run_id = await start_run(flow)
    async with db.transaction():
        await db.execute(
            "UPDATE runs SET status = 'handed_off', finished_at = now() WHERE id = $1", run_id
        )
        racing = asyncio.ensure_future(propose(flow, run_id))
        await blocked_on_a_lock(db)
    refused = await racing
    assert (refused.status_code, refused.json()["code"]) == (429, "run_limit_exceeded")
    assert refused.json()["run_status"] == "handed_off"
    assert refused.json()["limit"] is None
    assert refused.json()["recoverable"] is False
    state = await run_state(flow, run_id)
    assert (state["status"], state["limit"]) == ("handed_off", None)


async def test_a_run_out_of_time_or_failures_reads_as_failed_before_any_call_is_refused(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """An orchestrator that polls its run must not read ``active`` for a run that can admit
    no call any more, nor finish it ``completed`` after its limit ended it."""
    late = await start_run(flow, max_seconds=1)
    await asyncio.sleep(1.2)
    state = await run_state(flow, late)
    assert (state["status"], state["limit"], state["recoverable"]) == (
        "failed",
        "max_seconds",
        True,
    )
    assert await db.fetchval("SELECT status FROM runs WHERE id = $1", late) == "failed"
    finished = await flow.post(f"/runs/{late}/finish", {"status": "completed"})
    assert (finished.status_code, finished.json()["code"]) == (400, "invalid_request")

    failing = await start_run(flow, max_failures=1)
    await providers.fault("/support/tickets", "status_500", count=1)
    failed = await flow.execute(
        "create_ticket", {"subject": "one", "body": "b"}, new_key(), run_id=failing
    )
    assert failed.status_code == 504
    state = await run_state(flow, failing)
    assert (state["status"], state["limit"]) == ("failed", "max_failures")


async def test_an_admission_finds_the_run_by_its_id_however_many_runs_its_actor_has(
    db: asyncpg.Connection,
) -> None:
    """On a table the planner has no statistics of (a new deployment: here a fresh copy of
    ``runs``), the admission must still look the run up by its id, not read every run of its
    actor through their index."""
    async with db.transaction():
        await db.execute("CREATE TEMP TABLE runs (LIKE public.runs INCLUDING ALL) ON COMMIT DROP")
        await db.execute(
            "INSERT INTO runs (id, tenant, actor, status, max_calls, max_seconds, max_cost,"
            " max_repeats, max_failures) SELECT 'run_' || i, 'acme', 'alice', 'active', 200,"
            " 3600, 100, 5, 5 FROM generate_series(1, 400) i"
        )
        plan = await db.fetchval(
            "EXPLAIN (FORMAT JSON) " + runs_store.ADMIT_AT_ONCE,
            "run_7",
            1,
            0.0,
            "acme",
            "alice",
            "sha256:x",
            "get_order",
        )
    scans = [
        node.get("Index Cond")
        for node in _nodes(json.loads(plan)[0]["Plan"])
        if node.get("Relation Name") == "runs" and node["Node Type"].endswith("Scan")
    ]
    assert scans == ["(id = 'run_7'::text)"]


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


async def scoped_run(flow: Flow, tools: list[str]) -> str:
    scope = {"tools": tools, "outside": "deny"}
    response = await flow.post("/runs", {"task": "help a customer", "scope": scope})
    assert response.status_code == 200, response.text
    return response.json()["run_id"]  # type: ignore[no-any-return]


async def order_reads(providers: Providers) -> list[str]:
    """The provider's reads of an order itself (not of its owner)."""
    return [
        r["path"]
        for r in await providers.requests()
        if r["path"].startswith("/billing/orders/") and not r["path"].endswith("/owner")
    ]


async def owner_lookups(providers: Providers) -> int:
    return sum(r["path"].endswith("/owner") for r in await providers.requests())


async def test_a_read_outside_its_runs_scope_is_refused_counted_once_and_never_sent(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """A new read in a run is decided before its run is read, and its scope is judged
    where it is admitted: a tool outside it is refused as it always was, recorded once."""
    run_id = await scoped_run(flow, ["create_ticket"])
    refused = await read(flow, run_id)
    assert (refused.status_code, refused.json()["code"]) == (403, "out_of_scope")
    assert await order_reads(providers) == []
    assert (await run_state(flow, run_id))["counters"]["calls"] == 1
    rows = await db.fetch("SELECT state, run_id FROM calls")
    assert [(r["state"], r["run_id"]) for r in rows] == [("denied", run_id)]


async def test_a_scope_narrowed_between_two_reads_refuses_the_second(
    flow: Flow, providers: Providers
) -> None:
    """The first read reads the run; the second, in a run now known to be the user's, is
    decided before the run is read, and its admission finds the narrowed scope."""
    run_id = await scoped_run(flow, ["get_order", "create_ticket"])
    assert (await read(flow, run_id)).status_code == 200
    narrowed = await flow.client.patch(
        f"/runs/{run_id}", json={"scope": {"tools": ["create_ticket"]}}, headers=flow.auth()
    )
    assert narrowed.status_code == 200, narrowed.text
    refused = await read(flow, run_id)
    assert (refused.status_code, refused.json()["code"]) == (403, "out_of_scope")
    assert await order_reads(providers) == ["/billing/orders/ord_1"]  # the first only
    assert await owner_lookups(providers) == 2  # one each, never a second decision's
    assert (await run_state(flow, run_id))["counters"]["calls"] == 2


async def test_a_read_naming_another_users_run_records_nothing_whatever_it_asks(
    flow: Flow, db: asyncpg.Connection, providers: Providers
) -> None:
    """Whether the read would be allowed, refused by the policy or invalid, naming another
    user's run is answered as a run that does not exist, before anything is recorded."""
    run_id = await start_run(flow)
    erin = {"sub": "erin", "roles": "support"}
    for arguments in ({"order_id": "ord_1"}, {"order_id": "ord_9"}, {"order_id": 7}):
        body = {"tool": "get_order", "arguments": arguments, "run_id": run_id}
        response = await flow.post("/execute", body, erin)
        assert (response.status_code, response.json()["code"]) == (404, "not_found"), arguments
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert await db.fetchval("SELECT calls FROM runs WHERE id = $1", run_id) == 0
    assert await order_reads(providers) == []


async def test_a_read_in_a_run_asks_for_its_owner_once_whatever_the_answer(
    flow: Flow, providers: Providers
) -> None:
    """Decided before its run is read (the run known to be the user's), a read is not
    decided a second time on facts looked up again: an owner lookup that failed fails the
    read, as outside a run."""
    run_id = await start_run(flow)
    assert (await read(flow, run_id)).status_code == 200
    await providers.fault("/billing/orders/ord_1/owner", "status_500", count=1)
    failed = await read(flow, run_id)
    assert (failed.status_code, failed.json()["code"]) == (502, "provider_unavailable")
    assert await owner_lookups(providers) == 2
    assert await order_reads(providers) == ["/billing/orders/ord_1"]


def test_own_runs_know_a_run_only_as_its_owners_and_forget_the_oldest_first() -> None:
    own = OwnRuns(size=2)
    alice, erin = Principal("alice", "acme", frozenset()), Principal("erin", "acme", frozenset())
    globex_alice = Principal("alice", "globex", frozenset())
    for name in ("run_a", "run_b"):
        own.saw(run_of(name, "acme", "alice"))
    assert own.owns(alice, "run_a")
    assert own.owns(alice, "run_b")
    assert not own.owns(erin, "run_a")
    assert not own.owns(globex_alice, "run_a")
    assert not own.owns(alice, "run_c")
    own.saw(run_of("run_c", "acme", "erin"))
    assert not own.owns(alice, "run_a")  # forgotten: read again on its next call
    assert own.owns(alice, "run_b")
    assert own.owns(erin, "run_c")


def run_of(run_id: str, tenant: str, actor: str) -> RunRow:
    return RunRow(run_id, tenant, actor, None, "active", None, None, None, 200, 3600, 100, 3, 10)
