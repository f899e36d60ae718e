"""Executing a stored call by its id alone: the stored tool and normalized arguments, the
call's own approval and latest preview, re-authorized from scratch."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.conftest import Providers
from tests.flows import Auth, Flow, new_key, refund_args

REFUNDS = "/billing/refunds"


@pytest.fixture
def flow(client: httpx.AsyncClient, auth: Auth) -> Flow:
    return Flow(client, auth)


async def effects(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def by_call(
    flow: Flow, call_id: str, key: str | None, who: dict[str, str] | None = None, **extra: object
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return await flow.post("/execute", {"call_id": call_id, **extra}, who, headers)


async def test_an_approved_refund_runs_by_call_id_alone_once(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal, approval_id = await flow.approved_refund()
    key = new_key()
    first = await by_call(flow, proposal["call_id"], key)
    assert first.status_code == 200, first.text
    assert (first.json()["call_id"], first.json()["status"]) == (proposal["call_id"], "succeeded")
    again = await by_call(flow, proposal["call_id"], key)
    assert again.json() == {**first.json(), "replayed": True}
    other_key = await by_call(flow, proposal["call_id"], new_key())
    assert (other_key.status_code, other_key.json()["code"]) == (409, "approval_consumed")
    assert await effects(providers) == 1
    row = await db.fetchrow("SELECT approval_id, state FROM executions")
    assert row is not None
    assert (row["approval_id"], row["state"]) == (approval_id, "succeeded")


async def test_the_matching_tool_and_arguments_may_be_sent_along(
    flow: Flow, providers: Providers
) -> None:
    proposal, _ = await flow.approved_refund()
    response = await by_call(
        flow,
        proposal["call_id"],
        new_key(),
        tool="issue_refund",
        arguments=refund_args(currency="EUR"),
    )
    assert response.status_code == 200, response.text
    assert await effects(providers) == 1


async def test_other_arguments_or_another_tool_than_the_calls_are_a_mismatch(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal, _ = await flow.approved_refund(150.0)
    call_id = proposal["call_id"]
    other = await by_call(flow, call_id, new_key(), arguments=refund_args(160.0))
    assert (other.status_code, other.json()["code"]) == (409, "approval_mismatch")
    assert other.json()["mismatch"] == ["arguments"]
    tool = await by_call(flow, call_id, new_key(), tool="get_order", arguments={})
    assert (tool.status_code, tool.json()["code"]) == (409, "approval_mismatch")
    assert tool.json()["mismatch"] == ["tool"]
    invalid = await by_call(flow, call_id, new_key(), arguments={"amount": -1})
    assert (invalid.status_code, invalid.json()["code"]) == (422, "invalid_arguments")
    assert await effects(providers) == 0
    assert await db.fetchval("SELECT count(*) FROM executions") == 0


async def test_a_call_without_an_approval_or_with_a_rejection_does_not_run_by_id(
    flow: Flow, providers: Providers
) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    preview = await flow.dry_run(proposal["call_id"])
    unapproved = await by_call(flow, proposal["call_id"], new_key())
    assert (unapproved.status_code, unapproved.json()["code"]) == (403, "approval_required")
    await flow.approve(proposal["call_id"], preview["snapshot_hash"], decision="reject")
    rejected = await by_call(flow, proposal["call_id"], new_key())
    assert (rejected.status_code, rejected.json()["code"]) == (403, "approval_rejected")
    assert await effects(providers) == 0


async def test_a_call_whose_approval_expired_is_told_so_by_call_id_too(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal, approval_id = await flow.approved_refund()
    await db.execute(
        "UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = $1", approval_id
    )
    expired = await by_call(flow, proposal["call_id"], new_key())
    assert (expired.status_code, expired.json()["code"]) == (403, "approval_expired")
    event = await db.fetchval(
        "SELECT event FROM audit_events WHERE call_id = $1 AND code = 'approval_expired'",
        proposal["call_id"],
    )
    assert event == "expired"
    assert await effects(providers) == 0


async def test_a_mutation_by_call_id_still_needs_its_key(flow: Flow, providers: Providers) -> None:
    proposal, _ = await flow.approved_refund()
    response = await by_call(flow, proposal["call_id"], None)
    assert (response.status_code, response.json()["code"]) == (400, "idempotency_key_missing")
    assert await effects(providers) == 0


async def test_a_read_runs_by_call_id_alone(flow: Flow, db: asyncpg.Connection) -> None:
    proposal = await flow.propose("get_order", {"order_id": "ord_1"})
    response = await by_call(flow, proposal["call_id"], None)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["id"] == "ord_1"
    state = await db.fetchval("SELECT state FROM calls WHERE id = $1", proposal["call_id"])
    assert state == "succeeded"


async def test_another_actor_cannot_run_a_call_by_its_id(flow: Flow, providers: Providers) -> None:
    proposal, _ = await flow.approved_refund()
    response = await by_call(
        flow, proposal["call_id"], new_key(), {"sub": "carol", "roles": "support"}
    )
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert await effects(providers) == 0


async def test_without_call_id_tool_and_arguments_are_required(flow: Flow) -> None:
    response = await flow.post("/execute", {"tool": "get_order"})
    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")


async def test_invalid_arguments_sent_for_an_approved_call_leave_it_runnable(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    proposal, _ = await flow.approved_refund()
    call_id = proposal["call_id"]
    typo = await by_call(flow, call_id, new_key(), arguments=refund_args(-1.0))
    assert (typo.status_code, typo.json()["code"]) == (422, "invalid_arguments")
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == "approved"
    denied = await db.fetchval(
        "SELECT count(*) FROM audit_events WHERE call_id = $1 AND code = 'invalid_arguments'",
        call_id,
    )
    assert denied == 1
    runs = await by_call(flow, call_id, new_key())
    assert runs.status_code == 200, runs.text
    assert await effects(providers) == 1
