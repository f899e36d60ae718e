"""``approval.quorum: N``: N distinct approvers, none of them the actor, each approve the same
preview before the call runs, once; a rejection by any one is final; an approval of the N
that expires or goes stale counts no more. Through the ASGI app against real PostgreSQL,
Redis and the demo providers, which count effects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import Providers, running_app
from tests.flows import BOB, Auth, Flow, new_key, refund_args

REFUNDS = "/billing/refunds"
FIONA = {"sub": "fiona", "roles": "finance_approver"}
FRANK = {"sub": "frank", "roles": "support,finance_approver"}  # may propose refunds too
REFUND = 'approvers: ["role:finance_approver"], ttl_s: 300,'


@pytest.fixture(scope="module")
def quorum_catalog(tmp_path_factory: pytest.TempPathFactory, catalog_dir: Path) -> Path:
    directory = tmp_path_factory.mktemp("quorum")
    text = (catalog_dir / "demo.yaml").read_text()
    assert REFUND in text
    (directory / "demo.yaml").write_text(text.replace(REFUND, REFUND + " quorum: 2,"))
    return directory


@pytest.fixture(scope="module")
async def two_person(env: dict[str, str], quorum_catalog: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app({**env, "TOOLGATE_CATALOG": str(quorum_catalog)}) as client:
        yield client


@pytest.fixture
def flow(two_person: httpx.AsyncClient, auth: Auth, clean: None, providers: Providers) -> Flow:
    return Flow(two_person, auth)


async def effects(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def previewed(flow: Flow, who: dict[str, str] | None = None) -> tuple[str, str]:
    args = refund_args(150.0, customer_id=(who or {"sub": "alice"})["sub"])
    proposal = await flow.propose("issue_refund", args, who)
    assert proposal["next"] == "dry_run"
    preview = await flow.dry_run(proposal["call_id"], who)
    return proposal["call_id"], preview["snapshot_hash"]


async def approve(flow: Flow, call_id: str, snapshot: str, who: dict[str, str]) -> dict[str, Any]:
    answer = await flow.approve(call_id, snapshot, who)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def history(flow: Flow, call_id: str, who: dict[str, str]) -> dict[str, Any]:
    answer = await flow.client.get(f"/calls/{call_id}", headers=flow.auth(**who))
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def pending(flow: Flow, who: dict[str, str]) -> dict[str, str]:
    """The pending inbox of ``who``: call id → its ``approvals``."""
    answer = await flow.client.get("/approvals?status=pending", headers=flow.auth(**who))
    assert answer.status_code == 200, answer.text
    return {item["call_id"]: item["approvals"] for item in answer.json()["items"]}


async def execute(flow: Flow, approval_id: str, key: str | None = None) -> httpx.Response:
    return await flow.execute(
        "issue_refund", refund_args(150.0), key or new_key(), approval_id=approval_id
    )


async def test_a_call_runs_only_once_two_approvers_agreed_and_uses_both_approvals(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    assert await pending(flow, BOB) == {call_id: "0/2"}
    first = await approve(flow, call_id, snapshot, BOB)
    assert first["approvals"] == "1/2"
    assert await pending(flow, BOB) == {}  # decided by bob: the other approver's turn
    assert await pending(flow, FIONA) == {call_id: "1/2"}
    seen = await history(flow, call_id, FIONA)
    assert (seen["state"], seen["approvals"], seen["may_decide"]) == (
        "awaiting_approval",
        "1/2",
        True,
    )
    assert (await history(flow, call_id, BOB))["may_decide"] is False
    early = await execute(flow, first["approval_id"])
    assert (early.status_code, early.json()["code"]) == (403, "approval_required")
    assert early.json()["approvals"] == "1/2"
    assert await effects(providers) == 0
    second = await approve(flow, call_id, snapshot, FIONA)
    assert second["approvals"] == "2/2"
    assert (await history(flow, call_id, BOB))["state"] == "approved"
    key = new_key()
    done = await execute(flow, first["approval_id"], key)
    assert done.json()["status"] == "succeeded", done.text
    assert (await execute(flow, first["approval_id"], key)).json()["replayed"] is True
    again = await execute(flow, second["approval_id"])
    assert (again.status_code, again.json()["code"]) == (409, "approval_consumed")
    assert await effects(providers) == 1
    used = await db.fetch("SELECT approver, consumed_by FROM approvals ORDER BY approver")
    assert [r["approver"] for r in used] == ["bob", "fiona"]
    assert used[0]["consumed_by"] is not None
    assert used[0]["consumed_by"] == used[1]["consumed_by"]  # one execution used both
    assert (await history(flow, call_id, BOB))["approvals"] == "2/2"


async def test_the_actor_is_never_one_of_the_quorum_even_holding_the_role(flow: Flow) -> None:
    call_id, snapshot = await previewed(flow, FRANK)
    own = await flow.approve(call_id, snapshot, FRANK)
    assert (own.status_code, own.json()["code"]) == (403, "approver_forbidden")
    assert call_id not in await pending(flow, FRANK)


async def test_a_double_click_by_one_approver_counts_once(
    flow: Flow, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    answers = await asyncio.gather(*(flow.approve(call_id, snapshot, BOB) for _ in range(4)))
    assert [a.status_code for a in answers] == [200] * 4
    assert len({a.json()["approval_id"] for a in answers}) == 1
    assert {a.json()["approvals"] for a in answers} == {"1/2"}
    assert await db.fetchval("SELECT count(*) FROM approvals") == 1
    assert (await history(flow, call_id, FIONA))["state"] == "awaiting_approval"


async def test_two_approvers_at_once_make_the_quorum_and_the_call_runs_once(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    bob, fiona = await asyncio.gather(
        flow.approve(call_id, snapshot, BOB), flow.approve(call_id, snapshot, FIONA)
    )
    assert (bob.status_code, fiona.status_code) == (200, 200)
    assert sorted([bob.json()["approvals"], fiona.json()["approvals"]]) == ["1/2", "2/2"]
    assert (await history(flow, call_id, BOB))["state"] == "approved"
    runs = await asyncio.gather(
        execute(flow, bob.json()["approval_id"]), execute(flow, fiona.json()["approval_id"])
    )
    assert sorted(r.status_code for r in runs) == [200, 409]
    assert await effects(providers) == 1
    assert await db.fetchval("SELECT count(DISTINCT consumed_by) FROM approvals") == 1


async def test_a_rejection_by_either_approver_is_final(flow: Flow, providers: Providers) -> None:
    call_id, snapshot = await previewed(flow)
    approved = await approve(flow, call_id, snapshot, BOB)
    rejected = await flow.approve(call_id, snapshot, FIONA, decision="reject")
    assert rejected.status_code == 200, rejected.text
    assert (await history(flow, call_id, BOB))["state"] == "rejected"
    refused = await execute(flow, approved["approval_id"])
    assert (refused.status_code, refused.json()["code"]) == (403, "approval_rejected")
    late = await flow.approve(call_id, snapshot, FRANK)
    assert (late.status_code, late.json()["code"]) == (403, "approval_rejected")
    assert await effects(providers) == 0


async def test_an_approval_of_the_two_that_expires_counts_no_more(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(flow)
    bob = await approve(flow, call_id, snapshot, BOB)
    await db.execute(
        "UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = $1",
        bob["approval_id"],
    )
    fiona = await approve(flow, call_id, snapshot, FIONA)
    assert fiona["approvals"] == "1/2"  # bob's no longer counts
    assert (await history(flow, call_id, BOB))["state"] == "awaiting_approval"
    assert await pending(flow, BOB) == {call_id: "1/2"}  # bob's turn again
    expired = await execute(flow, bob["approval_id"])
    assert (expired.status_code, expired.json()["code"]) == (403, "approval_expired")
    short = await execute(flow, fiona["approval_id"])
    assert (short.status_code, short.json()["code"]) == (403, "approval_required")
    again = await approve(flow, call_id, snapshot, BOB)
    assert again["approvals"] == "2/2"
    done = await execute(flow, fiona["approval_id"])
    assert done.json()["status"] == "succeeded", done.text
    assert await effects(providers) == 1


async def test_a_changed_preview_needs_both_approvals_again(
    flow: Flow, providers: Providers
) -> None:
    """A quorum approval that goes stale is handled as a single one: refused, and the call
    awaits both approvers on its new preview."""
    call_id, snapshot = await previewed(flow)
    bob = await approve(flow, call_id, snapshot, BOB)
    await approve(flow, call_id, snapshot, FIONA)
    small = await flow.propose("issue_refund", refund_args(30.0))
    await flow.dry_run(small["call_id"])
    done = await flow.execute("issue_refund", refund_args(30.0), new_key())
    assert done.json()["status"] == "succeeded", done.text
    stale = await execute(flow, bob["approval_id"])
    assert (stale.status_code, stale.json()["code"]) == (409, "approval_stale")
    newer = (await flow.dry_run(call_id))["snapshot_hash"]
    assert newer != snapshot
    assert await pending(flow, BOB) == {call_id: "0/2"}
    assert (await approve(flow, call_id, newer, BOB))["approvals"] == "1/2"
    assert (await approve(flow, call_id, newer, FIONA))["approvals"] == "2/2"
    ran = await execute(flow, bob["approval_id"])  # the old one: bound to the old preview
    assert (ran.status_code, ran.json()["code"]) == (409, "approval_mismatch")
    assert await effects(providers) == 1  # the small refund only
