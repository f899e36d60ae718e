"""The one list of gates (``app.calls.gating``): which gates a mutation's first execution
needs is decided once, and the fast claim of a fresh key and the checks read that one
answer; a refusal is recorded by its class, whatever its status."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import asyncpg
import pytest

from app.calls import gating, mutation
from app.calls.policy import Decision
from app.catalog.loader import load
from app.catalog.models import Tool
from app.errors import ToolgateError
from tests.conftest import Providers
from tests.flows import Flow, new_key

TICKET = {"subject": "Broken", "body": "It broke."}


@pytest.fixture(scope="module")
def tools(catalog_dir: Path) -> Mapping[str, Tool]:
    """The demo catalog's tools, as the test app runs them."""
    return load(catalog_dir, {}).tools


def gated(
    tool: Tool, impact: str = "low", run_id: str | None = None, named: bool = False
) -> gating.Gated:
    decision = Decision(impact=impact, next="execute")  # type: ignore[arg-type]
    return gating.Gated(decision, tool, run_id, named)


def test_a_low_impact_call_outside_a_run_on_its_own_needs_no_gate(
    tools: Mapping[str, Tool],
) -> None:
    assert gating.needed(gated(tools["create_ticket"])) == ()


def test_each_fact_adds_its_gate_in_order(tools: Mapping[str, Tool]) -> None:
    ticket, refund = tools["create_ticket"], tools["issue_refund"]
    assert gating.needed(gated(ticket, named=True)) == ("same_call",)
    assert gating.needed(gated(ticket, run_id="run_1")) == ("run",)
    assert gating.needed(gated(refund, impact="high", run_id="run_1", named=True)) == (
        "same_call",
        "approval",
        "run",
    )


def test_a_tool_that_requires_a_dry_run_needs_it_unless_its_approval_checks_the_preview(
    tools: Mapping[str, Tool],
) -> None:
    refund = tools["issue_refund"]
    assert refund.require_dry_run
    assert gating.needed(gated(refund)) == ("dry_run",)
    assert gating.needed(gated(refund, impact="high")) == ("approval",)


class FakeRefusal(
    ToolgateError, status=422, code="invalid_arguments", title="Fake gate", recorded=True
):
    """A gate's refusal that answers 422: recorded because its class says so."""


async def test_a_new_gate_runs_for_a_fresh_key_and_its_refusal_is_recorded(
    flow: Flow,
    providers: Providers,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked: list[str] = []

    async def fake(execution: mutation.Execution) -> None:
        checked.append(execution.key)
        raise FakeRefusal("the fake gate refuses")

    monkeypatch.setattr(gating, "GATES", (*gating.GATES, gating.Gate("fake", lambda g: True)))
    monkeypatch.setitem(mutation.CHECKS, "fake", fake)
    key = new_key()
    refused = await flow.execute("create_ticket", TICKET, key)
    assert (refused.status_code, refused.json()["code"]) == (422, "invalid_arguments"), refused.text
    assert checked == [key]  # the fresh key was not claimed before the gate ran
    assert (await providers.stats())["effects_by_path"] == {}
    assert await db.fetchval("SELECT count(*) FROM executions") == 0
    call = await db.fetchrow("SELECT decision, code FROM calls")
    assert call is not None
    assert tuple(call) == ("deny", "invalid_arguments")
    events = await db.fetch("SELECT event, code FROM audit_events")
    assert [tuple(e) for e in events] == [("denied", "invalid_arguments")]


async def test_without_the_new_gate_the_same_fresh_key_is_claimed_at_once_and_runs(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    done = await flow.execute("create_ticket", TICKET, new_key())
    assert done.json()["status"] == "succeeded", done.text
    assert (await providers.stats())["effects_by_path"] == {"/support/tickets": 1}
