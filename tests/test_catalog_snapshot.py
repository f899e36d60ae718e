"""A request is decided and recorded under one catalog: the one it read when it began.

A reload (SIGHUP) swaps the app's catalog whole while requests are in flight; a request
that is waiting on a provider must still record the policy version it was decided under,
never the newer one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.main import create_app, reload_catalog
from app.settings import Settings
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
    assert stored is not None
    audited = await db.fetchval(
        "SELECT policy_version FROM audit_events WHERE call_id = $1 AND event = 'dry_run'",
        proposal["call_id"],
    )
    assert (stored["policy_version"], audited) == (
        original.policy_version,
        original.policy_version,
    )


def copies_of_get_order(count: int) -> str:
    """``count`` more read tools, for a catalog that takes a while to compile."""
    return "".join(
        f"""
  get_order_{i}:
    mutation: false
    provider: billing
    execute: {{method: GET, path: "/orders/{{order_id}}"}}
    parameters:
      type: object
      additionalProperties: false
      required: [order_id]
      properties:
        order_id: {{type: string, x-resource: order}}
"""
        for i in range(count)
    )


async def test_of_two_reloads_in_a_row_the_later_one_decides_the_catalog(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Two SIGHUPs: the first reads a large catalog and is still compiling it when the file
    is replaced (say, a tool removed in a hurry) and the second reload reads the new file.
    The catalog in force must be the one on disk, not the older one whose slower load
    happens to finish last."""
    demo = Path(env["TOOLGATE_CATALOG"], "demo.yaml").read_text()
    catalog = tmp_path / "demo.yaml"
    catalog.write_text(demo)
    application = create_app(Settings.from_env({**env, "TOOLGATE_CATALOG": str(tmp_path)}))
    async with application.router.lifespan_context(application):
        state = application.state.toolgate
        catalog.write_text(demo.replace("demo-2026-11-29", "large") + copies_of_get_order(1000))
        first = asyncio.create_task(reload_catalog(state))
        await asyncio.sleep(0.3)  # the first reload has read the large file, and compiles it
        catalog.write_text(demo.replace("demo-2026-11-29", "small"))
        await reload_catalog(state)
        await first
        assert state.catalog.label == "small"
        assert "get_order_0" not in state.catalog.tools


async def test_a_refused_reload_keeps_the_catalog_and_is_counted_for_an_alert(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A broken catalog on disk at SIGHUP: the one in force stays (``/readyz`` names it),
    and ``/metrics`` counts the refusal, so that ops can alert on a reload that did not
    take; a good one counts as reloaded."""
    demo = Path(env["TOOLGATE_CATALOG"], "demo.yaml").read_text()
    catalog = tmp_path / "demo.yaml"
    catalog.write_text(demo)
    application = create_app(Settings.from_env({**env, "TOOLGATE_CATALOG": str(tmp_path)}))

    def reloads(text: str, outcome: str) -> float:
        line = f'toolgate_catalog_reloads_total{{outcome="{outcome}"}} '
        found = [row for row in text.splitlines() if row.startswith(line)]
        return float(found[0].removeprefix(line)) if found else 0.0

    async with application.router.lifespan_context(application):
        state = application.state.toolgate
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as client:
            before = (await client.get("/metrics")).text
            in_force = state.catalog.policy_version
            catalog.write_text(demo + "\n  - this is not a tool\n")
            await reload_catalog(state)
            assert (await client.get("/readyz")).json()["checks"]["catalog"] == in_force
            catalog.write_text(demo.replace("demo-2026-11-29", "fixed"))
            await reload_catalog(state)
            after = (await client.get("/metrics")).text
    assert state.catalog.label == "fixed"
    assert reloads(after, "refused") == reloads(before, "refused") + 1
    assert reloads(after, "reloaded") == reloads(before, "reloaded") + 1
