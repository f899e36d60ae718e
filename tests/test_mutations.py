"""Dry-run, approvals and exactly-once execution through the ASGI app, against real
PostgreSQL, Redis and provider servers that count their side effects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from app.catalog.loader import load
from tests.conftest import ROOT, Providers, running_app
from tests.flows import ALICE, Auth, Flow, new_key, refund_args

REFUNDS = "/billing/refunds"


@pytest.fixture
async def locked_flow(
    lock_env: dict[str, str], clean: None, providers: Providers, auth: Auth
) -> AsyncIterator[Flow]:
    """A flow through an app of its own, with each lock backend."""
    async with running_app(lock_env) as client:
        yield Flow(client, auth)


async def effects(providers: Providers, path: str = REFUNDS) -> int:
    return (await providers.stats())["effects_by_path"].get(path, 0)  # type: ignore[no-any-return]


async def events(db: asyncpg.Connection) -> list[str]:
    return [r["event"] for r in await db.fetch("SELECT event FROM audit_events ORDER BY seq")]


async def test_a_high_impact_refund_runs_once_and_replays(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    assert (proposal["impact"], proposal["next"]) == ("high", "dry_run")
    preview = await flow.dry_run(proposal["call_id"])
    assert preview["next"] == "approval"
    assert preview["snapshot"]["refundable"] == 250.0
    inbox = await flow.client.get("/approvals", headers=flow.auth("bob", roles="finance_approver"))
    assert [i["call_id"] for i in inbox.json()["items"]] == [proposal["call_id"]]
    assert inbox.json()["items"][0]["snapshot_hash"] == preview["snapshot_hash"]
    approval = await flow.approve(proposal["call_id"], preview["snapshot_hash"])
    assert approval.status_code == 200, approval.text
    binding = approval.json()["binding"]
    assert binding == {
        "actor": "alice",
        "tenant": "acme",
        "tool": "issue_refund",
        "target": {"type": "order", "id": "ord_1"},
        "policy_version": proposal["policy_version"],
        "fingerprint": proposal["fingerprint"],
        "snapshot_hash": preview["snapshot_hash"],
    }
    key = new_key()
    first = await flow.execute(
        "issue_refund", refund_args(), key, approval_id=approval.json()["approval_id"]
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["status"], body["provider_status"], body["replayed"]) == ("succeeded", 201, False)
    assert body["call_id"] == proposal["call_id"]
    again = await flow.execute(
        "issue_refund", refund_args(), key, approval_id=approval.json()["approval_id"]
    )
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == {**body, "replayed": True}
    assert await effects(providers) == 1
    sent = [r for r in await providers.requests() if r["path"] == REFUNDS]
    assert sent[0]["headers"]["Idempotency-Key"] == body["operation_id"]
    # the second dry_run is the recheck of the approved preview just before it ran
    assert await events(db) == [
        "proposed",
        "dry_run",
        "approved",
        "dry_run",
        "executed",
        "replayed",
    ]
    row = await db.fetchrow("SELECT state, approval_id FROM executions")
    assert row is not None
    assert (row["state"], row["approval_id"]) == ("succeeded", approval.json()["approval_id"])
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", body["call_id"]) == (
        "succeeded"
    )


async def test_a_changed_amount_after_approval_is_a_mismatch(
    flow: Flow, providers: Providers
) -> None:
    _, approval_id = await flow.approved_refund(150.0)
    response = await flow.execute(
        "issue_refund", refund_args(160.0), new_key(), approval_id=approval_id
    )
    assert response.status_code == 409
    assert response.json()["code"] == "approval_mismatch"
    assert "arguments" in response.json()["mismatch"]
    assert await effects(providers) == 0
    ok = await flow.execute("issue_refund", refund_args(150.0), new_key(), approval_id=approval_id)
    assert ok.json()["status"] == "succeeded"


async def test_high_impact_without_a_valid_approval_is_refused(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    missing = await flow.execute("issue_refund", refund_args(), new_key())
    assert (missing.status_code, missing.json()["code"]) == (403, "approval_required")
    unknown = await flow.execute("issue_refund", refund_args(), new_key(), approval_id="apr_x")
    assert unknown.json()["code"] == "approval_required"
    proposal = await flow.propose("issue_refund", refund_args())
    preview = await flow.dry_run(proposal["call_id"])
    rejected = await flow.approve(proposal["call_id"], preview["snapshot_hash"], decision="reject")
    response = await flow.execute(
        "issue_refund", refund_args(), new_key(), approval_id=rejected.json()["approval_id"]
    )
    assert (response.status_code, response.json()["code"]) == (403, "approval_rejected")
    assert await effects(providers) == 0
    assert await db.fetchval("SELECT count(*) FROM executions") == 0


async def test_an_expired_approval_fails_closed(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    _, approval_id = await flow.approved_refund()
    await db.execute("UPDATE approvals SET expires_at = now() - interval '1 second'")
    response = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert (response.status_code, response.json()["code"]) == (403, "approval_expired")
    assert await effects(providers) == 0
    assert (await events(db))[-1] == "expired"


async def test_an_approval_is_single_use(flow: Flow, providers: Providers) -> None:
    _, approval_id = await flow.approved_refund()
    first = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert first.json()["status"] == "succeeded"
    second = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert (second.status_code, second.json()["code"]) == (409, "approval_consumed")
    assert await effects(providers) == 1


async def test_one_approval_used_by_twelve_parallel_executions_has_one_effect(
    locked_flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """Each refusal is recorded, also of those that lost the race only at consumption."""
    flow = locked_flow
    _, approval_id = await flow.approved_refund()
    responses = await asyncio.gather(
        *(
            flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
            for _ in range(12)
        )
    )
    statuses = sorted((r.status_code, r.json().get("code")) for r in responses)
    assert statuses == [(200, None)] + [(409, "approval_consumed")] * 11
    assert await effects(providers) == 1
    rows = await db.fetch(
        "SELECT event, code, approval_id FROM audit_events"
        " WHERE event IN ('executed', 'denied') ORDER BY seq"
    )
    assert sorted((r["event"], r["code"]) for r in rows) == [
        ("denied", "approval_consumed")
    ] * 11 + [("executed", None)]
    assert await db.fetchval("SELECT count(*) FROM executions") == 1


async def test_twenty_four_parallel_retries_of_one_key_have_one_effect(
    locked_flow: Flow, providers: Providers
) -> None:
    flow = locked_flow
    _, approval_id = await flow.approved_refund()
    key = new_key()
    responses = await asyncio.gather(
        *(
            flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
            for _ in range(24)
        )
    )
    codes = {r.status_code for r in responses}
    assert codes <= {200, 409}
    assert all(
        r.json()["code"] == "idempotency_in_flight" for r in responses if r.status_code == 409
    )
    assert await effects(providers) == 1
    final = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
    assert final.json()["status"] == "succeeded"
    assert final.headers["Idempotent-Replayed"] == "true"


async def test_a_retry_while_a_slow_recheck_and_send_run_is_in_flight_not_a_second_send(
    env: dict[str, str], clean: None, providers: Providers, auth: Auth, tmp_path: Path
) -> None:
    """The key's holder may ask the provider twice in a row (the recheck's preview, then the
    send), each up to the provider's timeout: its lock must outlast both. A lock lapsed
    while its holder still waits on the send let a retry take the key, find the record open,
    and send the same operation a second time."""
    text = (ROOT / "catalog" / "demo.yaml").read_text()
    (tmp_path / "demo.yaml").write_text(text.replace("timeout_s: 5", "timeout_s: 7"))
    async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
        flow = Flow(client, auth)
        _, approval_id = await flow.approved_refund()
        await providers.fault(REFUNDS + "/preview", "stall_before_effect", seconds=6.5)
        await providers.fault(REFUNDS, "stall_before_effect", seconds=6.5)
        key = new_key()
        first = asyncio.create_task(
            flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
        )
        retries = []
        while not first.done():
            await asyncio.sleep(0.25)
            retry = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
            if not first.done():
                retries.append((retry.status_code, retry.json().get("code")))
        assert (await first).json()["status"] == "succeeded"
    assert set(retries) == {(409, "idempotency_in_flight")}
    assert len([r for r in await providers.requests() if r["path"] == REFUNDS]) == 1
    assert await effects(providers) == 1


async def test_another_actor_can_neither_use_the_approval_nor_replay_the_key(
    flow: Flow, providers: Providers
) -> None:
    _, approval_id = await flow.approved_refund()
    key = new_key()
    done = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
    assert done.json()["status"] == "succeeded"
    mallory = {"sub": "mallory", "roles": "support"}
    mallory_args = refund_args(customer_id="mallory")
    replay = await flow.execute(
        "issue_refund", mallory_args, key, who=mallory, approval_id=approval_id
    )
    assert replay.status_code in (403, 409)
    assert replay.json()["code"] in ("approval_mismatch", "approval_consumed")
    assert "result" not in replay.json()
    steal = await flow.execute(
        "issue_refund", mallory_args, new_key(), who=mallory, approval_id=approval_id
    )
    assert steal.status_code == 409
    assert "actor" in steal.json()["mismatch"]
    assert await effects(providers) == 1


async def test_a_catalog_change_between_approval_and_execution_is_a_mismatch(
    flow: Flow, providers: Providers, app: Any, settings: Any
) -> None:
    _, approval_id = await flow.approved_refund()
    state = app.state.toolgate
    original = state.catalog
    changed = settings.catalog_path / "demo.yaml"
    text = changed.read_text()
    try:
        changed.write_text(text.replace("Refund part or all", "Refund some or all"))
        state.catalog = load(settings.catalog_path, settings.env)
        assert state.catalog.policy_version != original.policy_version
        response = await flow.execute(
            "issue_refund", refund_args(), new_key(), approval_id=approval_id
        )
    finally:
        changed.write_text(text)
        state.catalog = original
    assert response.status_code == 409
    assert response.json()["mismatch"] == ["policy_version"]
    assert await effects(providers) == 0


async def test_the_approver_must_hold_authority_in_the_actors_tenant(flow: Flow) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    preview = await flow.dry_run(proposal["call_id"])
    dave = {"sub": "dave", "roles": "customer"}
    response = await flow.approve(proposal["call_id"], preview["snapshot_hash"], dave)
    assert (response.status_code, response.json()["code"]) == (403, "approver_forbidden")
    carol = {"sub": "carol", "tenant": "globex", "roles": "finance_approver"}
    response = await flow.approve(proposal["call_id"], preview["snapshot_hash"], carol)
    assert (response.status_code, response.json()["code"]) == (404, "not_found")  # as missing
    own = await flow.approve(proposal["call_id"], preview["snapshot_hash"], ALICE)
    assert (own.status_code, own.json()["code"]) == (403, "approver_forbidden")  # no actor


async def test_self_approval_is_refused_without_owner_in_the_list(flow: Flow) -> None:
    release = {"sub": "rita", "roles": "developer,release_manager"}
    args = {"service_id": "svc_web", "version": "v1.5.0", "tenant_id": "acme"}
    proposal = await flow.propose("deploy_service", args, release)
    preview = await flow.dry_run(proposal["call_id"], release)
    own = await flow.approve(proposal["call_id"], preview["snapshot_hash"], release)
    assert (own.status_code, own.json()["code"]) == (403, "approver_forbidden")


async def test_approving_a_stale_preview_is_a_mismatch(flow: Flow) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    await flow.dry_run(proposal["call_id"])
    response = await flow.approve(proposal["call_id"], "sha256:" + "0" * 64)
    assert (response.status_code, response.json()["code"]) == (409, "approval_mismatch")
    assert response.json()["mismatch"] == ["snapshot_hash"]


async def test_only_the_actor_may_dry_run_and_only_tools_with_a_preview(flow: Flow) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    other = await flow.post(
        "/dry-run", {"call_id": proposal["call_id"]}, {"sub": "bob", "roles": "support"}
    )
    assert (other.status_code, other.json()["code"]) == (404, "not_found")
    lead = {"sub": "alice", "roles": "support"}
    email = await flow.propose(
        "update_customer_email", {"customer_id": "cus_dave", "email": "d@new.example"}, lead
    )
    no_preview = await flow.post("/dry-run", {"call_id": email["call_id"]}, lead)
    assert (no_preview.status_code, no_preview.json()["code"]) == (400, "invalid_request")


async def test_a_high_impact_tool_without_dry_run_binds_a_null_snapshot(
    flow: Flow, providers: Providers
) -> None:
    agent = {"sub": "alice", "roles": "support"}
    lead = {"sub": "sam", "roles": "support_lead"}
    args = {"customer_id": "cus_dave", "email": "d@new.example"}
    proposal = await flow.propose("update_customer_email", args, agent)
    assert (proposal["impact"], proposal["next"]) == ("high", "approval")
    inbox = await flow.client.get("/approvals", headers=flow.auth("sam", roles="support_lead"))
    assert [i["call_id"] for i in inbox.json()["items"]] == [proposal["call_id"]]
    approval = await flow.approve(proposal["call_id"], None, lead)
    assert approval.status_code == 200, approval.text
    assert approval.json()["binding"]["snapshot_hash"] is None
    done = await flow.execute(
        "update_customer_email", args, new_key(), agent, approval_id=approval.json()["approval_id"]
    )
    assert done.json()["status"] == "succeeded", done.text
    assert await effects(providers, "/crm/customers/cus_dave") == 1


@pytest.mark.parametrize(
    ("key", "code"),
    [
        (None, "idempotency_key_missing"),
        ("short", "idempotency_key_invalid"),
        ("has spaces in it, sadly", "idempotency_key_invalid"),
        ('"unbalanced-quote-key-123', "idempotency_key_invalid"),
    ],
)
async def test_mutations_need_a_well_formed_key(
    flow: Flow, providers: Providers, key: str | None, code: str
) -> None:
    response = await flow.execute("create_ticket", {"subject": "s", "body": "b"}, key)
    assert (response.status_code, response.json()["code"]) == (400, code)
    assert await effects(providers, "/support/tickets") == 0


async def test_a_quoted_key_is_the_same_key_as_the_bare_one(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    key = new_key()
    args = {"subject": "printer", "body": "on fire"}
    first = await flow.execute("create_ticket", args, f'"{key}"')
    assert first.status_code == 200, first.text
    second = await flow.execute("create_ticket", args, key)
    assert second.headers["Idempotent-Replayed"] == "true"
    assert await effects(providers, "/support/tickets") == 1
    # The replay's claim found the key taken: it recorded no second call or execution.
    assert await db.fetchval("SELECT count(*) FROM calls") == 1
    assert [tuple(r) for r in await db.fetch("SELECT call_id, state FROM executions")] == [
        (first.json()["call_id"], "succeeded")
    ]
    assert await events(db) == ["executed", "replayed"]


async def test_a_key_reused_for_other_arguments_is_refused(
    flow: Flow, providers: Providers
) -> None:
    key = new_key()
    assert (await flow.execute("create_ticket", {"subject": "a", "body": "b"}, key)).is_success
    reused = await flow.execute("create_ticket", {"subject": "other", "body": "b"}, key)
    assert (reused.status_code, reused.json()["code"]) == (422, "idempotency_key_reused")
    assert await effects(providers, "/support/tickets") == 1


async def test_require_dry_run_refuses_an_unpreviewed_low_impact_call(
    flow: Flow, providers: Providers
) -> None:
    args = refund_args(20.0)
    refused = await flow.execute("issue_refund", args, new_key())
    assert (refused.status_code, refused.json()["code"]) == (403, "dry_run_required")
    proposal = await flow.propose("issue_refund", args)
    assert proposal["impact"] == "low"
    await flow.dry_run(proposal["call_id"])
    changed = await flow.execute("issue_refund", refund_args(21.0), new_key())
    assert changed.json()["code"] == "dry_run_required"
    done = await flow.execute("issue_refund", args, new_key())
    assert done.json()["status"] == "succeeded"
    assert await effects(providers) == 1


async def test_a_provider_refusal_is_stored_and_replayed(flow: Flow, providers: Providers) -> None:
    args = {"order_id": "ord_2", "amount": 50.0, "customer_id": "alice"}
    proposal = await flow.propose("issue_refund", args)
    await flow.dry_run(proposal["call_id"])
    key = new_key()
    first = await flow.execute("issue_refund", args, key)
    assert first.status_code == 200
    assert (first.json()["status"], first.json()["provider_status"]) == ("failed", 422)
    again = await flow.execute("issue_refund", args, key)
    assert again.json() == {**first.json(), "replayed": True}
    assert len([r for r in await providers.requests() if r["path"] == REFUNDS]) == 1


async def test_a_timeout_after_the_effect_is_reconciled_on_retry(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    _, approval_id = await flow.approved_refund()
    await providers.fault(REFUNDS, "stall_after_effect", seconds=1.5)
    key = new_key()
    first = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
    assert (first.status_code, first.json()["code"]) == (504, "provider_timeout")
    assert first.json()["status"] == "unknown"
    assert await db.fetchval("SELECT state FROM executions") == "unknown"
    retry = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
    assert retry.status_code == 200, retry.text
    assert (retry.json()["status"], retry.json()["provider_status"]) == ("succeeded", 201)
    assert retry.json()["result"]["amount"] == 150.0
    assert await effects(providers) == 1
    assert (await events(db))[-2:] == ["failed", "reconciled"]


async def test_a_5xx_after_the_effect_is_reconciled_not_repeated(
    flow: Flow, providers: Providers
) -> None:
    await providers.fault("/support/tickets", "status_500_after_effect")
    key = new_key()
    args = {"subject": "s", "body": "b"}
    first = await flow.execute("create_ticket", args, key)
    assert (first.status_code, first.json()["status"]) == (504, "unknown")
    retry = await flow.execute("create_ticket", args, key)
    assert retry.json()["status"] == "succeeded", retry.text
    assert await effects(providers, "/support/tickets") == 1


async def test_a_record_resolved_after_its_retention_still_replays(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """Retention runs from the outcome, not the claim: a record that stayed unknown past its
    expiry, once reconciled, must not be forgotten at once, or the client's next retry with
    the same key would be a first call and act a second time."""
    await providers.fault("/support/tickets", "status_500_after_effect")
    key = new_key()
    args = {"subject": "s", "body": "b"}
    first = await flow.execute("create_ticket", args, key)
    assert (first.status_code, first.json()["status"]) == (504, "unknown")
    await db.execute(  # claimed a day ago, with a day's retention: run out while unknown
        "UPDATE executions SET created_at = now() - interval '1 day' - interval '1 second',"
        " expires_at = now() - interval '1 second'"
    )
    reconciled = await flow.execute("create_ticket", args, key)
    assert reconciled.json()["status"] == "succeeded", reconciled.text
    again = await flow.execute("create_ticket", args, key)
    assert again.status_code == 200, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == {**reconciled.json(), "replayed": True}
    assert await effects(providers, "/support/tickets") == 1
    assert await db.fetchval("SELECT expires_at > now() FROM executions") is True


async def test_a_redirect_is_never_followed(flow: Flow, providers: Providers) -> None:
    await providers.fault("/support/tickets", "redirect")
    response = await flow.execute("create_ticket", {"subject": "s", "body": "b"}, new_key())
    assert (response.status_code, response.json()["code"]) == (504, "provider_timeout")
    assert [r["path"] for r in await providers.requests()] == ["/support/tickets"]


async def test_the_inbox_filters_by_status(flow: Flow, db: asyncpg.Connection) -> None:
    bob = flow.auth("bob", roles="finance_approver")

    async def inbox(status: str) -> list[str]:
        response = await flow.client.get(f"/approvals?status={status}", headers=bob)
        assert response.status_code == 200, response.text
        return [item["call_id"] for item in response.json()["items"]]

    approved, _ = await flow.approved_refund()
    rejected = await flow.propose("issue_refund", refund_args(120.0))
    preview = await flow.dry_run(rejected["call_id"])
    await flow.approve(rejected["call_id"], preview["snapshot_hash"], decision="reject")
    pending = await flow.propose("issue_refund", refund_args(130.0))
    await flow.dry_run(pending["call_id"])
    assert await inbox("pending") == [pending["call_id"]]
    assert await inbox("approved") == [approved["call_id"]]
    assert await inbox("rejected") == [rejected["call_id"]]
    assert await inbox("expired") == []
    await db.execute("UPDATE approvals SET expires_at = now() - interval '1 second'")
    assert await inbox("expired") == [approved["call_id"]]
    assert await inbox("approved") == []
    outsider = await flow.client.get("/approvals", headers=flow.auth("dave", roles="customer"))
    assert outsider.json()["items"] == []
