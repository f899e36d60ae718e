"""GET /calls/{id}: the whole life of a call, for its actor, approvers and auditors only."""

from __future__ import annotations

import dataclasses
import tracemalloc
from typing import Any

import pytest

from tests.flows import Flow, new_key, refund_args


async def test_a_calls_history_tells_its_whole_life(flow: Flow) -> None:
    args = refund_args(note="customer is upset")
    proposal = await flow.propose("issue_refund", args)
    preview = await flow.dry_run(proposal["call_id"])
    approval = await flow.approve(proposal["call_id"], preview["snapshot_hash"])
    executed = await flow.execute(
        "issue_refund", args, new_key(), approval_id=approval.json()["approval_id"]
    )
    response = await flow.client.get(f"/calls/{proposal['call_id']}", headers=flow.auth())
    assert response.status_code == 200, response.text
    life = response.json()
    assert life["state"] == "succeeded"
    assert life["proposal"]["arguments"]["note"] == "[redacted]"
    assert [d["event"] for d in life["decisions"]] == [
        "proposed",
        "dry_run",
        "approved",
        "dry_run",
        "executed",
    ]
    assert life["decisions"][3]["outcome"] == {
        "recheck": "unchanged",
        "snapshot_hash": preview["snapshot_hash"],
    }
    assert life["proposal"]["taint"] == []
    assert life["dry_runs"][0]["snapshot_hash"] == preview["snapshot_hash"]
    assert life["approval"]["approver"] == "bob"
    assert life["approval"]["consumed_by"] == executed.json()["operation_id"]
    assert life["executions"][0]["state"] == "succeeded"
    assert life["timings"]["provider_ms"] > 0


@pytest.mark.parametrize(
    ("who", "visible"),
    [
        ({"sub": "alice", "roles": "support"}, True),
        ({"sub": "bob", "roles": "finance_approver"}, True),
        ({"sub": "audrey", "roles": "auditor"}, True),
        ({"sub": "root", "tenant": "globex", "roles": "admin"}, True),
        ({"sub": "sam", "roles": "support"}, False),
        ({"sub": "carol", "tenant": "globex", "roles": "auditor"}, False),
    ],
)
async def test_only_the_actor_approvers_and_auditors_see_a_call(
    flow: Flow, who: dict[str, str], visible: bool
) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    response = await flow.client.get(f"/calls/{proposal['call_id']}", headers=flow.auth(**who))
    if visible:
        assert response.status_code == 200
    else:
        assert (response.status_code, response.json()["code"]) == (404, "not_found")


async def test_a_call_of_a_tool_the_catalog_no_longer_holds_shows_no_argument_unmasked(
    flow: Flow, app: Any
) -> None:
    """Which of its arguments were sensitive went with the tool: all are masked."""
    proposal = await flow.propose("issue_refund", refund_args(note="customer is upset"))
    state = app.state.toolgate
    original = state.catalog
    state.catalog = dataclasses.replace(
        original, tools={name: t for name, t in original.tools.items() if name != "issue_refund"}
    )
    try:
        response = await flow.client.get(
            f"/calls/{proposal['call_id']}", headers=flow.auth(sub="audrey", roles="auditor")
        )
    finally:
        state.catalog = original
    assert response.status_code == 200, response.text
    arguments = response.json()["proposal"]["arguments"]
    assert arguments.keys() == proposal["arguments"].keys()
    assert set(arguments.values()) == {"[redacted]"}


async def test_reading_a_history_holds_none_of_what_its_refused_requests_sent(
    flow: Flow,
) -> None:
    """A refused request that names a call is audited under it with the arguments it sent
    (up to a body's size each): the history shows none of them, and reading it must not
    load them, or a few refused requests make every read of the call cost a worker
    hundreds of megabytes."""
    proposal = await flow.propose("get_order", {"order_id": "ord_1"})
    bulk = {"order_id": "ord_1", "junk": [0] * 450_000}
    for _ in range(2):
        refused = await flow.post("/execute", {"call_id": proposal["call_id"], "arguments": bulk})
        assert refused.json()["code"] == "invalid_arguments"
    tracemalloc.start()
    try:
        response = await flow.client.get(f"/calls/{proposal['call_id']}", headers=flow.auth())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200
    assert [d["event"] for d in response.json()["decisions"]] == ["proposed", "denied", "denied"]
    assert peak < len(refused.request.content)
