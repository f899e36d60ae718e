"""A call is decided once: at most one live approval, a rejection is final, an executed call
is not approved again, and an approved call still needs its dry-run to be unexpired. Through
the ASGI app against real PostgreSQL, Redis and the demo providers, which count effects."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from app.db import migrate, migration_files
from tests.conftest import RUN, Providers, fresh_database
from tests.flows import BOB, Flow, new_key, refund_args

REFUNDS = "/billing/refunds"
FRANK = {"sub": "frank", "roles": "finance_approver"}


async def effects(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def previewed(flow: Flow, amount: float = 150.0) -> tuple[str, str]:
    """A high-impact refund proposed and previewed: (call_id, snapshot_hash)."""
    proposal = await flow.propose("issue_refund", refund_args(amount))
    preview = await flow.dry_run(proposal["call_id"])
    return proposal["call_id"], preview["snapshot_hash"]


async def decided_events(db: asyncpg.Connection) -> list[str]:
    rows = await db.fetch(
        "SELECT event FROM audit_events WHERE event IN ('approved', 'rejected') ORDER BY seq"
    )
    return [r["event"] for r in rows]


async def inbox(flow: Flow, status: str) -> list[str]:
    response = await flow.client.get(f"/approvals?status={status}", headers=flow.auth(**BOB))
    assert response.status_code == 200, response.text
    return [item["call_id"] for item in response.json()["items"]]


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert (response.status_code, response.json()["code"]) == (status, code), response.text
    assert response.headers["content-type"].startswith("application/problem+json")


async def test_twenty_concurrent_identical_approves_store_one_approval(
    flow: Flow, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    answers = await asyncio.gather(*(flow.approve(call_id, snapshot) for _ in range(20)))
    assert [a.status_code for a in answers] == [200] * 20
    assert len({a.json()["approval_id"] for a in answers}) == 1
    assert len({a.json()["expires_at"] for a in answers}) == 1
    assert await db.fetchval("SELECT count(*) FROM approvals") == 1
    assert await decided_events(db) == ["approved"]


async def test_two_approvers_racing_leave_one_live_approval(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    answers = await asyncio.gather(
        *(flow.approve(call_id, snapshot, who) for _ in range(10) for who in (BOB, FRANK))
    )
    winners = [a for a in answers if a.status_code == 200]
    assert len({a.json()["approval_id"] for a in winners}) == 1
    assert len(winners) == 10  # every request of the approver who came first
    for loser in (a for a in answers if a.status_code != 200):
        refused(loser, 409, "approval_consumed")
    assert await db.fetchval("SELECT count(*) FROM approvals") == 1
    assert await decided_events(db) == ["approved"]
    approval_id = winners[0].json()["approval_id"]
    run = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert run.json()["status"] == "succeeded", run.text
    assert await effects(providers) == 1


async def test_a_live_approval_refuses_every_other_decision_and_repeats_its_own(
    flow: Flow, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    first = await flow.approve(call_id, snapshot)
    assert first.status_code == 200, first.text
    refused(await flow.approve(call_id, snapshot, FRANK), 409, "approval_consumed")
    refused(await flow.approve(call_id, snapshot, FRANK, "reject"), 409, "approval_consumed")
    refused(await flow.approve(call_id, snapshot, BOB, "reject"), 409, "approval_consumed")
    again = await flow.approve(call_id, snapshot)
    assert again.status_code == 200
    assert again.json() == first.json()
    assert await db.fetchval("SELECT count(*) FROM approvals") == 1
    assert await decided_events(db) == ["approved"]


async def test_an_executed_call_cannot_be_approved_again(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    approval = await flow.approve(call_id, snapshot)
    approval_id = approval.json()["approval_id"]
    done = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert done.json()["status"] == "succeeded", done.text
    # A fresh preview of the executed call does not reopen it for a decision.
    again = await flow.dry_run(call_id)
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == "succeeded"
    assert await inbox(flow, "pending") == []
    for who, decision in ((BOB, "approve"), (FRANK, "approve"), (FRANK, "reject")):
        response = await flow.approve(call_id, again["snapshot_hash"], who, decision)
        refused(response, 409, "approval_consumed")
    assert await db.fetchval("SELECT count(*) FROM approvals") == 1
    assert await decided_events(db) == ["approved"]
    assert await effects(providers) == 1


async def test_a_call_cannot_be_approved_while_it_executes(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    approval_id = (await flow.approve(call_id, snapshot)).json()["approval_id"]
    await providers.fault(REFUNDS, "stall_before_effect", seconds=0.6)
    running = asyncio.create_task(
        flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    )
    for _ in range(100):
        if await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == "executing":
            break
        await asyncio.sleep(0.01)
    refused(await flow.approve(call_id, snapshot, FRANK), 409, "approval_consumed")
    assert (await running).json()["status"] == "succeeded"
    assert await effects(providers) == 1
    assert await db.fetchval("SELECT count(*) FROM approvals") == 1


async def test_a_rejection_is_final_for_approval_and_execution(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    rejection = await flow.approve(call_id, snapshot, BOB, "reject")
    assert rejection.status_code == 200, rejection.text
    rejection_id = rejection.json()["approval_id"]
    refused(await flow.approve(call_id, snapshot, FRANK), 403, "approval_rejected")
    refused(await flow.approve(call_id, snapshot, BOB), 403, "approval_rejected")
    repeated = await flow.approve(call_id, snapshot, BOB, "reject")
    assert repeated.json()["approval_id"] == rejection_id
    for extra in (
        {"approval_id": rejection_id},
        {"approval_id": rejection_id, "call_id": call_id},
        {"call_id": call_id},
    ):
        response = await flow.execute("issue_refund", refund_args(), new_key(), **extra)
        refused(response, 403, "approval_rejected")
    assert await effects(providers) == 0
    assert await db.fetchval("SELECT count(*) FROM executions") == 0
    assert await db.fetchval("SELECT count(*) FROM approvals") == 1
    assert await decided_events(db) == ["rejected"]
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == "rejected"
    assert (await inbox(flow, "rejected"), await inbox(flow, "approved")) == ([call_id], [])


async def test_an_approval_cannot_run_another_call_with_the_same_arguments(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    approved, snapshot = await previewed(flow)
    approval_id = (await flow.approve(approved, snapshot)).json()["approval_id"]
    other, other_snapshot = await previewed(flow)
    await flow.approve(other, other_snapshot, FRANK, "reject")
    response = await flow.execute(
        "issue_refund", refund_args(), new_key(), approval_id=approval_id, call_id=other
    )
    refused(response, 403, "approval_rejected")
    assert await effects(providers) == 0
    third, _ = await previewed(flow)
    response = await flow.execute(
        "issue_refund", refund_args(), new_key(), approval_id=approval_id, call_id=third
    )
    refused(response, 403, "approval_required")
    assert await effects(providers) == 0
    states = {r["id"]: r["state"] for r in await db.fetch("SELECT id, state FROM calls")}
    assert states == {approved: "approved", other: "rejected", third: "awaiting_approval"}


async def test_an_approval_that_expired_unused_can_be_given_again(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    old = (await flow.approve(call_id, snapshot)).json()["approval_id"]
    await db.execute("UPDATE approvals SET expires_at = now() - interval '1 second'")
    assert await inbox(flow, "expired") == [call_id]
    new = await flow.approve(call_id, snapshot, FRANK)
    assert new.status_code == 200, new.text
    assert new.json()["approval_id"] != old
    assert await db.fetchval("SELECT count(*) FROM approvals") == 2
    assert await decided_events(db) == ["approved", "approved"]
    assert (await inbox(flow, "approved"), await inbox(flow, "expired")) == ([call_id], [])
    life = await flow.client.get(f"/calls/{call_id}", headers=flow.auth(**BOB))
    assert life.json()["approval"]["approval_id"] == new.json()["approval_id"]
    stale = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=old)
    refused(stale, 403, "approval_expired")
    run = await flow.execute(
        "issue_refund", refund_args(), new_key(), approval_id=new.json()["approval_id"]
    )
    assert run.json()["status"] == "succeeded", run.text
    assert await effects(providers) == 1


async def test_approvals_stored_before_the_fix_still_run_a_call_once(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """Rows the database may hold from before: a second live approval of one call, and an
    approval given after a rejection. Consumption itself refuses both."""
    call_id, snapshot = await previewed(flow)
    first = (await flow.approve(call_id, snapshot)).json()["approval_id"]
    twin = await copy_approval(db, first, "apr_twin", "approve")
    done = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=first)
    assert done.json()["status"] == "succeeded", done.text
    again = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=twin)
    refused(again, 409, "approval_consumed")
    assert await effects(providers) == 1

    rejected, rejected_snapshot = await previewed(flow, 120.0)
    override = (await flow.approve(rejected, rejected_snapshot)).json()["approval_id"]
    await copy_approval(db, override, "apr_reject", "reject")
    response = await flow.execute(
        "issue_refund", refund_args(120.0), new_key(), approval_id=override
    )
    refused(response, 409, "approval_consumed")
    assert await effects(providers) == 1


async def copy_approval(
    db: asyncpg.Connection, approval_id: str, new_id: str, decision: str
) -> str:
    await db.execute(
        """
        INSERT INTO approvals
        SELECT $2, call_id, $3, approver, comment, actor, tenant, tool, target_type, target_id,
               policy_version, fingerprint, snapshot_hash, created_at, expires_at, NULL, NULL
        FROM approvals WHERE id = $1
        """,
        approval_id,
        new_id,
        decision,
    )
    return new_id


async def test_an_expired_dry_run_blocks_an_approved_call(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    approval_id = (await flow.approve(call_id, snapshot)).json()["approval_id"]
    await db.execute("UPDATE dry_runs SET expires_at = now() - interval '1 second'")
    extras: list[dict[str, Any]] = [{}, {"call_id": call_id}]
    for extra in extras:
        response = await flow.execute(
            "issue_refund", refund_args(), new_key(), approval_id=approval_id, **extra
        )
        refused(response, 403, "dry_run_required")
    assert await effects(providers) == 0
    assert await db.fetchval("SELECT count(*) FROM executions") == 0
    denials = await db.fetch(
        "SELECT event, code, call_id FROM audit_events WHERE decision = 'deny' ORDER BY seq"
    )
    assert [(d["event"], d["code"]) for d in denials] == [("denied", "dry_run_required")] * 2
    assert denials[1]["call_id"] == call_id
    assert await db.fetchval("SELECT consumed_by FROM approvals") is None
    # A fresh preview showing the same thing makes the approval usable again.
    assert (await flow.dry_run(call_id))["snapshot_hash"] == snapshot
    run = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert run.json()["status"] == "succeeded", run.text
    assert await effects(providers) == 1


@asynccontextmanager
async def before_migration(
    admin_dsn: str, version: str, undo: str, calls: dict[str, str]
) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A fresh database as it was before migration ``version``: ``undo`` reverts its schema
    change, the migration is no longer recorded as applied, and it holds refunds of alice
    in acme, ``calls`` (id: state)."""
    async with fresh_database(admin_dsn, f"toolgate_test_{RUN}_{version}") as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(undo)
            await conn.execute(
                "DELETE FROM schema_migrations WHERE version LIKE $1", f"{version}_%"
            )
            await conn.executemany(
                """
                INSERT INTO calls (id, tenant, actor, tool, decision, state, policy_version,
                                   proposed_by)
                VALUES ($1, 'acme', 'alice', 'issue_refund', 'allow', $2, 'v', 'model')
                """,
                list(calls.items()),
            )
            yield url, conn
        finally:
            await conn.close()


async def test_the_migration_keeps_the_first_of_several_rejections(admin_dsn: str) -> None:
    """A database that collected several rejections of one call before 0006 migrates, and
    afterwards refuses a second rejection."""
    undo = "DROP INDEX approvals_one_rejection"
    async with before_migration(admin_dsn, "0006", undo, {"call_1": "rejected"}) as (url, conn):
        await conn.execute(
            """
            INSERT INTO approvals (id, call_id, decision, approver, actor, tenant, tool,
                                   policy_version, fingerprint, created_at, expires_at)
            SELECT 'apr_' || n, 'call_1', d, 'bob', 'alice', 'acme', 'issue_refund', 'v',
                   'sha256:f', now() + n * interval '1 second', now()
            FROM (VALUES (1, 'reject'), (2, 'approve'), (3, 'reject')) AS r(n, d);
            """
        )
        assert await migrate(url) == [v for v, _ in migration_files() if v.startswith("0006")]
        rows = await conn.fetch("SELECT id, decision FROM approvals ORDER BY id")
        assert Counter(r["decision"] for r in rows) == {"reject": 1, "approve": 1}
        assert [r["id"] for r in rows if r["decision"] == "reject"] == ["apr_1"]
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                """
                INSERT INTO approvals (id, call_id, decision, approver, actor, tenant, tool,
                                       policy_version, fingerprint, expires_at)
                VALUES ('apr_4', 'call_1', 'reject', 'frank', 'alice', 'acme',
                        'issue_refund', 'v', 'sha256:f', now())
                """
            )


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_a_later_denial_is_audited_but_never_rewrites_a_decided_or_executed_call(
    flow: Flow, providers: Providers, db: asyncpg.Connection, decision: str
) -> None:
    call_id, snapshot_hash = await previewed(flow)
    assert (await flow.approve(call_id, snapshot_hash, decision=decision)).status_code == 200
    if decision == "approve":
        approval_id = await db.fetchval("SELECT id FROM approvals WHERE call_id = $1", call_id)
        executed = await flow.execute(
            "issue_refund", refund_args(), new_key(), call_id=call_id, approval_id=approval_id
        )
        assert executed.status_code == 200, executed.text
    before = await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id)
    # The same actor, now without the tool's role: re-authorization denies the call.
    denied = await flow.execute(
        "issue_refund",
        refund_args(),
        new_key(),
        {"sub": "alice", "roles": "customer"},
        call_id=call_id,
    )
    assert (denied.status_code, denied.json()["code"]) == (403, "tool_forbidden")
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == before
    assert before == ("succeeded" if decision == "approve" else "rejected")
    codes = await db.fetch(
        "SELECT code FROM audit_events WHERE call_id = $1 AND event = 'denied'", call_id
    )
    assert [r["code"] for r in codes][-1] == "tool_forbidden"
    assert await effects(providers) == (1 if decision == "approve" else 0)


async def test_a_call_nobody_decided_leaves_the_inbox_when_its_approval_window_passes(
    flow: Flow, db: asyncpg.Connection
) -> None:
    """A high-impact call of a tool without a preview is pending from its proposal for the
    approval's ttl_s (300 s in the demo catalog); a previewed one until its preview expires."""
    agent = {"sub": "alice", "roles": "support"}
    lead = flow.auth("sam", roles="support_lead")
    email = await flow.propose(
        "update_customer_email", {"customer_id": "cus_dave", "email": "d@new.example"}, agent
    )
    refund, _ = await previewed(flow)

    async def pending(headers: dict[str, str]) -> list[dict[str, Any]]:
        response = await flow.client.get("/approvals?status=pending", headers=headers)
        assert response.status_code == 200, response.text
        return response.json()["items"]  # type: ignore[no-any-return]

    [item] = await pending(lead)
    assert item["call_id"] == email["call_id"]
    window = datetime.fromisoformat(item["expires_at"]) - datetime.fromisoformat(
        item["requested_at"]
    )
    assert timedelta(seconds=299) < window <= timedelta(seconds=301)
    [previewed_item] = await pending(flow.auth(**BOB))
    assert previewed_item["call_id"] == refund
    preview = await db.fetchval("SELECT expires_at FROM dry_runs WHERE call_id = $1", refund)
    assert datetime.fromisoformat(previewed_item["expires_at"]) == preview
    # Five minutes later, nobody having decided:
    await db.execute(
        "UPDATE calls SET created_at = created_at - interval '301 seconds',"
        " pending_until = pending_until - interval '301 seconds'"
    )
    await db.execute("UPDATE dry_runs SET expires_at = expires_at - interval '301 seconds'")
    assert await pending(lead) == []
    assert await pending(flow.auth(**BOB)) == []
    states = {r["state"] for r in await db.fetch("SELECT state FROM calls")}
    assert states == {"awaiting_approval"}, "nothing about the calls themselves changed"
    # A new preview opens the window again.
    await flow.dry_run(refund)
    assert [i["call_id"] for i in await pending(flow.auth(**BOB))] == [refund]


async def test_a_call_past_its_approval_window_can_no_longer_be_decided(
    flow: Flow, db: asyncpg.Connection
) -> None:
    """A tool without a preview: once its window passed, the call is out of the inbox, and
    neither its history nor ``/approve`` may offer a decision any more (a previewed call's
    window is its preview's, and a new preview opens it again)."""
    lead = flow.auth("sam", roles="support_lead")
    args = {"customer_id": "cus_dave", "email": "d@new.example"}
    email = await flow.propose("update_customer_email", args, {"sub": "alice", "roles": "support"})
    history = await flow.client.get(f"/calls/{email['call_id']}", headers=lead)
    assert history.json()["may_decide"] is True
    await db.execute("UPDATE calls SET pending_until = now() - interval '1 second'")
    history = await flow.client.get(f"/calls/{email['call_id']}", headers=lead)
    assert history.json()["may_decide"] is False
    response = await flow.client.post(
        "/approve",
        json={"call_id": email["call_id"], "snapshot_hash": None, "decision": "approve"},
        headers=lead,
    )
    assert (response.status_code, response.json()["code"]) == (403, "approval_expired")
    assert await db.fetchval("SELECT count(*) FROM approvals") == 0
    assert await db.fetchval("SELECT state FROM calls") == "awaiting_approval"


async def test_the_inbox_lists_a_call_once_by_its_latest_decision(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """Approved again after an approval expired unused, or rejected after it: the call shows
    under its latest decision only, and a used approval stays approved once it expires."""

    async def expire(call_id: str) -> None:
        await db.execute(
            "UPDATE approvals SET expires_at = now() - interval '1 second' WHERE call_id = $1",
            call_id,
        )

    again, again_snapshot = await previewed(flow)
    refused_later, refused_snapshot = await previewed(flow, 120.0)
    for call_id, snapshot in ((again, again_snapshot), (refused_later, refused_snapshot)):
        assert (await flow.approve(call_id, snapshot)).status_code == 200
        await expire(call_id)
    assert await inbox(flow, "expired") == [refused_later, again]
    second = await flow.approve(again, again_snapshot)
    assert second.status_code == 200, second.text
    rejection = await flow.approve(refused_later, refused_snapshot, decision="reject")
    assert rejection.status_code == 200, rejection.text
    assert await inbox(flow, "approved") == [again]
    assert await inbox(flow, "rejected") == [refused_later]
    assert await inbox(flow, "expired") == []
    latest = await db.fetch("SELECT call_id, decision FROM approvals WHERE latest ORDER BY id")
    assert sorted((r["call_id"], r["decision"]) for r in latest) == sorted(
        [(again, "approve"), (refused_later, "reject")]
    )
    assert await db.fetchval("SELECT count(*) FROM approvals") == 4

    run = await flow.execute(
        "issue_refund", refund_args(), new_key(), approval_id=second.json()["approval_id"]
    )
    assert run.json()["status"] == "succeeded", run.text
    await expire(again)
    assert await inbox(flow, "approved") == [again]
    assert await inbox(flow, "expired") == []
    assert await effects(providers) == 1


async def test_the_migration_marks_each_calls_standing_decision(admin_dsn: str) -> None:
    """A database from before 0014 gets `latest` on each call's rejection, or else on its
    latest approval."""
    undo = "ALTER TABLE approvals DROP COLUMN latest"
    calls = {"call_1": "approved", "call_2": "rejected"}
    async with before_migration(admin_dsn, "0014", undo, calls) as (url, conn):
        await conn.execute(
            """
            INSERT INTO approvals (id, call_id, decision, approver, actor, tenant, tool,
                                   policy_version, fingerprint, created_at, expires_at)
            SELECT 'apr_' || n, c, d, 'bob', 'alice', 'acme', 'issue_refund', 'v',
                   'sha256:f', now() + n * interval '1 second', now()
            FROM (VALUES (1, 'call_1', 'approve'), (2, 'call_1', 'approve'),
                         (3, 'call_2', 'reject'), (4, 'call_2', 'approve')) AS r(n, c, d);
            """
        )
        assert await migrate(url) == [v for v, _ in migration_files() if v.startswith("0014")]
        latest = await conn.fetch("SELECT id FROM approvals WHERE latest ORDER BY id")
        assert [r["id"] for r in latest] == ["apr_2", "apr_3"]
