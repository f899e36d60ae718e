"""Stale approvals: an approved call is previewed again just before it runs; if the world
changed since the approver saw it, it does not run (409 ``approval_stale``), its approval is
not used, and a new preview and approval let it run once."""

from __future__ import annotations

import asyncpg

from tests.conftest import Providers
from tests.flows import BOB, Flow, new_key, refund_args

REFUNDS = "/billing/refunds"
DEPLOYMENTS = "/deploy/deployments"
DEVELOPER = {"sub": "dan", "roles": "developer"}
RELEASE_MANAGER = {"sub": "rita", "roles": "release_manager"}


async def refunds(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def approved_snapshot(db: asyncpg.Connection, approval_id: str) -> str:
    return str(await db.fetchval("SELECT snapshot_hash FROM approvals WHERE id = $1", approval_id))


async def another_small_refund(flow: Flow) -> None:
    """A low-impact refund on the same order, which changes what its preview shows."""
    proposal = await flow.propose("issue_refund", refund_args(30.0))
    await flow.dry_run(proposal["call_id"])
    done = await flow.execute("issue_refund", refund_args(30.0), new_key())
    assert done.json()["status"] == "succeeded", done.text


async def test_an_approval_whose_preview_changed_does_not_run(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal, approval_id = await flow.approved_refund()
    approved_hash = await approved_snapshot(db, approval_id)
    await another_small_refund(flow)
    assert await refunds(providers) == 1

    stale = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert (stale.status_code, stale.json()["code"]) == (409, "approval_stale"), stale.text
    problem = stale.json()
    assert problem["approved_snapshot_hash"] == approved_hash
    assert problem["current_snapshot_hash"] not in (None, approved_hash)
    assert await refunds(providers) == 1
    approval = await db.fetchrow("SELECT consumed_by FROM approvals WHERE id = $1", approval_id)
    assert approval is not None
    assert approval["consumed_by"] is None
    assert (
        await db.fetchval("SELECT count(*) FROM executions WHERE approval_id = $1", approval_id)
        == 0
    )
    audited = await db.fetchrow(
        "SELECT decision, code, outcome FROM audit_events WHERE call_id = $1 AND event = 'denied'",
        proposal["call_id"],
    )
    assert audited is not None
    assert (audited["decision"], audited["code"]) == ("deny", "approval_stale")
    assert audited["outcome"] == {
        "approved_snapshot_hash": approved_hash,
        "current_snapshot_hash": problem["current_snapshot_hash"],
    }

    again = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert (again.status_code, again.json()["code"]) == (409, "approval_stale")
    assert await refunds(providers) == 1


async def test_a_new_preview_and_approval_let_a_stale_call_run_once(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal, stale_approval = await flow.approved_refund()
    call_id = proposal["call_id"]
    await another_small_refund(flow)
    refused = await flow.execute(
        "issue_refund", refund_args(), new_key(), approval_id=stale_approval
    )
    assert refused.json()["code"] == "approval_stale"

    preview = await flow.dry_run(call_id)
    assert preview["snapshot"]["refundable"] == 220.0
    assert (
        await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == "awaiting_approval"
    )
    inbox = await flow.client.get("/approvals?status=pending", headers=flow.auth(**BOB))
    assert [item["call_id"] for item in inbox.json()["items"]] == [call_id]
    old = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=stale_approval)
    assert (old.status_code, old.json()["code"]) == (409, "approval_mismatch")

    approval = await flow.approve(call_id, preview["snapshot_hash"])
    assert approval.status_code == 200, approval.text
    key = new_key()
    ran = await flow.execute(
        "issue_refund", refund_args(), key, approval_id=approval.json()["approval_id"]
    )
    assert ran.status_code == 200, ran.text
    replay = await flow.execute(
        "issue_refund", refund_args(), key, approval_id=approval.json()["approval_id"]
    )
    assert replay.json()["replayed"] is True
    assert await refunds(providers) == 2
    assert (
        await db.fetchval("SELECT consumed_by FROM approvals WHERE id = $1", stale_approval) is None
    )


async def test_an_unchanged_preview_runs_once_and_the_recheck_is_audited(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal, approval_id = await flow.approved_refund()
    approved_hash = await approved_snapshot(db, approval_id)
    key = new_key()
    ran = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
    assert ran.status_code == 200, ran.text
    replay = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
    assert replay.json()["replayed"] is True
    assert await refunds(providers) == 1
    previews = [r for r in await providers.requests() if r["path"] == REFUNDS + "/preview"]
    assert len(previews) == 2  # the approver's preview and the one recheck
    rechecks = await db.fetch(
        "SELECT outcome, approval_id FROM audit_events WHERE call_id = $1 AND event = 'dry_run'"
        " AND outcome ? 'recheck'",
        proposal["call_id"],
    )
    assert [(r["outcome"], r["approval_id"]) for r in rechecks] == [
        ({"recheck": "unchanged", "snapshot_hash": approved_hash}, approval_id)
    ]


async def test_a_recheck_the_provider_cannot_answer_runs_nothing(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    _, approval_id = await flow.approved_refund()
    await providers.fault(REFUNDS + "/preview", "status_500")
    failed = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert (failed.status_code, failed.json()["code"]) == (502, "provider_unavailable")
    assert await refunds(providers) == 0
    assert await db.fetchval("SELECT consumed_by FROM approvals WHERE id = $1", approval_id) is None
    ran = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert ran.status_code == 200, ran.text
    assert await refunds(providers) == 1


def deployment(version: str) -> dict[str, str]:
    return {"service_id": "svc_web", "version": version, "tenant_id": "acme"}


async def deployed(flow: Flow, version: str) -> None:
    """``svc_web`` deployed at ``version``: proposed, previewed, approved and run."""
    proposal = await flow.propose("deploy_service", deployment(version), DEVELOPER)
    preview = await flow.dry_run(proposal["call_id"], DEVELOPER)
    approval = await flow.approve(proposal["call_id"], preview["snapshot_hash"], RELEASE_MANAGER)
    assert approval.status_code == 200, approval.text
    done = await flow.post(
        "/execute", {"call_id": proposal["call_id"]}, DEVELOPER, {"Idempotency-Key": new_key()}
    )
    assert done.json()["status"] == "succeeded", done.text


async def test_an_approval_of_an_older_preview_never_runs_once_a_newer_one_reopened_the_call(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """Even when the world is back to what the approver saw, so that a recheck would pass:
    the approval stands on the call's latest preview, whichever one the request names."""
    proposal = await flow.propose("deploy_service", deployment("v1.5.0"), DEVELOPER)
    first = await flow.dry_run(proposal["call_id"], DEVELOPER)  # v1.4.2 -> v1.5.0
    approved = await flow.approve(proposal["call_id"], first["snapshot_hash"], RELEASE_MANAGER)
    approval_id = approved.json()["approval_id"]
    await deployed(flow, "v1.6.0")
    second = await flow.dry_run(proposal["call_id"], DEVELOPER)  # v1.6.0 -> v1.5.0
    assert second["snapshot_hash"] != first["snapshot_hash"]
    await deployed(flow, "v1.4.2")  # as the approver saw it again
    runs_before = (await providers.stats())["effects_by_path"][DEPLOYMENTS]
    for named in ({"dry_run_id": first["dry_run_id"]}, {}):
        refused = await flow.execute(
            "deploy_service",
            deployment("v1.5.0"),
            new_key(),
            DEVELOPER,
            approval_id=approval_id,
            **named,
        )
        assert (refused.status_code, refused.json()["code"]) == (409, "approval_mismatch")
        assert refused.json()["mismatch"] == ["snapshot_hash"]
    assert (await providers.stats())["effects_by_path"][DEPLOYMENTS] == runs_before
    consumed = await db.fetchval("SELECT consumed_by FROM approvals WHERE id = $1", approval_id)
    assert consumed is None
