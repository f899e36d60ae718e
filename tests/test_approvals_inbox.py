"""The inbox lists what this approver may decide: a page is filled with their requests however
many others wait in the tenant, and its cursor names only a request they were shown. Through
the ASGI app against real PostgreSQL, Redis and the demo providers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app import cursors
from tests.conftest import running_app
from tests.flows import ALICE, BOB, Auth, Flow, refund_args

PAGE = 50
DEVELOPER = {"sub": "devon", "roles": "developer"}
RELEASE_MANAGER = {"sub": "rita", "roles": "developer,release_manager"}
SUPPORT_LEAD = {"sub": "sam", "roles": "support_lead"}
CUSTOMER = {"sub": "dave", "roles": "customer"}


async def page(
    flow: Flow, who: dict[str, str], status: str = "pending", cursor: str | None = None
) -> dict[str, Any]:
    params = {"status": status, **({"cursor": cursor} if cursor else {})}
    response = await flow.client.get("/approvals", params=params, headers=flow.auth(**who))
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def ids(answer: dict[str, Any]) -> list[str]:
    return [item["call_id"] for item in answer["items"]]


def assert_cursor_names_the_last_item(answer: dict[str, Any]) -> None:
    last = answer["items"][-1]
    assert cursors.decode(answer["next_cursor"], 2) == [last["requested_at"], last["call_id"]]


async def pending_refund(flow: Flow) -> str:
    proposal = await flow.propose("issue_refund", refund_args(150.0))
    await flow.dry_run(proposal["call_id"])
    return proposal["call_id"]  # type: ignore[no-any-return]


async def pending_deploys(flow: Flow, count: int, who: dict[str, str] = DEVELOPER) -> list[str]:
    """``count`` previewed deployments awaiting a release manager, oldest first."""
    args = {"service_id": "svc_web", "version": "v1.5.0", "tenant_id": "acme"}
    calls = []
    for _ in range(count):
        proposal = await flow.propose("deploy_service", args, who)
        await flow.dry_run(proposal["call_id"], who)
        calls.append(proposal["call_id"])
    return calls


async def test_a_request_behind_a_full_page_of_others_is_on_the_first_page(flow: Flow) -> None:
    """The reviewer's case: one refund, then 55 deployments bob may not decide."""
    refund = await pending_refund(flow)
    deploys = await pending_deploys(flow, PAGE + 5)
    bob = await page(flow, BOB)
    assert ids(bob) == [refund]
    assert bob["next_cursor"] is None
    # The release manager's pages are full, newest first, and end where the requests do.
    first = await page(flow, RELEASE_MANAGER)
    assert ids(first) == deploys[::-1][:PAGE]
    assert_cursor_names_the_last_item(first)
    second = await page(flow, RELEASE_MANAGER, cursor=first["next_cursor"])
    assert ids(second) == deploys[::-1][PAGE:]
    assert second["next_cursor"] is None


async def test_a_caller_who_may_decide_nothing_gets_no_cursor(flow: Flow) -> None:
    """A cursor holds the id and time of the last request shown; from an empty page it would
    name a call the caller may not see."""
    await pending_deploys(flow, PAGE + 1)
    assert await page(flow, CUSTOMER) == {"items": [], "next_cursor": None}


async def test_a_page_ends_with_a_cursor_only_when_it_is_full(flow: Flow) -> None:
    refunds = [await pending_refund(flow) for _ in range(PAGE)]
    await pending_deploys(flow, 3)
    first = await page(flow, BOB)
    assert ids(first) == refunds[::-1]
    assert_cursor_names_the_last_item(first)
    assert await page(flow, BOB, cursor=first["next_cursor"]) == {"items": [], "next_cursor": None}


async def test_a_decided_request_behind_a_full_page_of_others_is_on_the_first_page(
    flow: Flow,
) -> None:
    rejected = (await flow.propose("issue_refund", refund_args(150.0)))["call_id"]
    preview = await flow.dry_run(rejected)
    refusal = await flow.approve(rejected, preview["snapshot_hash"], BOB, decision="reject")
    assert refusal.status_code == 200, refusal.text
    for _ in range(PAGE + 5):
        email = await flow.propose(
            "update_customer_email", {"customer_id": "cus_dave", "email": "d@new.example"}
        )
        decided = await flow.approve(email["call_id"], None, SUPPORT_LEAD, decision="reject")
        assert decided.status_code == 200, decided.text
    bob = await page(flow, BOB, "rejected")
    assert (ids(bob), bob["next_cursor"]) == ([rejected], None)
    lead = await page(flow, SUPPORT_LEAD, "rejected")
    assert len(lead["items"]) == PAGE
    assert rejected not in ids(lead)
    assert_cursor_names_the_last_item(lead)
    rest = await page(flow, SUPPORT_LEAD, "rejected", lead["next_cursor"])
    assert (len(rest["items"]), rest["next_cursor"]) == (5, None)


@pytest.fixture
async def self_approving(
    env: dict[str, str], self_approved_catalog: Path, auth: Auth, clean: None, providers: Any
) -> AsyncIterator[Flow]:
    catalog = {**env, "TOOLGATE_CATALOG": str(self_approved_catalog)}
    async with running_app(catalog) as client:
        yield Flow(client, auth)


async def test_the_demo_inbox_never_offers_the_actor_their_own_refund(flow: Flow) -> None:
    """The demo's refunds over 100.00 need a finance approver: their actor is not one."""
    own_refund = await pending_refund(flow)  # alice's
    assert ids(await page(flow, ALICE)) == []
    assert ids(await page(flow, BOB)) == [own_refund]


async def test_the_inbox_keeps_the_self_approval_rule(self_approving: Flow) -> None:
    """``actor`` lets the actor decide their own refund; a release manager may not decide
    their own deployment, which deploy_service does not list ``actor`` for."""
    flow = self_approving
    own_refund = await pending_refund(flow)  # alice's
    [own_deploy] = await pending_deploys(flow, 1, RELEASE_MANAGER)
    [other_deploy] = await pending_deploys(flow, 1)
    assert ids(await page(flow, ALICE)) == [own_refund]
    assert ids(await page(flow, {"sub": "erin", "roles": "support"})) == []
    assert ids(await page(flow, RELEASE_MANAGER)) == [other_deploy]
    assert ids(await page(flow, {"sub": "ravi", "roles": "release_manager"})) == [
        other_deploy,
        own_deploy,
    ]
