"""A request is decided and recorded under one catalog: the one it read when it began.

A reload (SIGHUP) swaps the app's catalog whole while requests are in flight; a request
that is waiting on a provider must still record the policy version it was decided under,
never the newer one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import Providers
from tests.flows import Auth, Flow, refund_args

PREVIEW = "/billing/refunds/preview"


@pytest.fixture
def flow(client: httpx.AsyncClient, auth: Auth) -> Flow:
    return Flow(client, auth)


async def test_a_reload_during_a_dry_run_does_not_change_the_policy_version_it_records(
    flow: Flow, providers: Providers, app: Any, db: asyncpg.Connection
) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    state = app.state.toolgate
    original = state.catalog
    reloaded = dataclasses.replace(original, policy_version="reloaded-while-previewing")
    await providers.fault(PREVIEW, "stall_before_effect", seconds=0.5)
    preview = asyncio.create_task(flow.dry_run(proposal["call_id"]))
    try:
        for _ in range(100):  # until the provider holds the preview request
            if any(r["path"] == PREVIEW for r in await providers.requests()):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the provider never received the preview")
        state.catalog = reloaded
        answer = await preview
    finally:
        state.catalog = original
    stored = await db.fetchrow(
        "SELECT policy_version FROM dry_runs WHERE id = $1", answer["dry_run_id"]
    )
    audited = await db.fetchval(
        "SELECT policy_version FROM audit_events WHERE call_id = $1 AND event = 'dry_run'",
        proposal["call_id"],
    )
    assert (stored["policy_version"], audited) == (
        original.policy_version,
        original.policy_version,
    )
