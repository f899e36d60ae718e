"""GET /calls/{id}: the whole life of a call, for its actor, approvers and auditors only."""

from __future__ import annotations

import dataclasses
import tracemalloc
from typing import Any

import asyncpg
import pytest

from app.calls import store
from tests.conftest import quiet
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
    flow: Flow, db: asyncpg.Connection
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
    await quiet(db)
    tracemalloc.start()
    try:
        response = await flow.client.get(f"/calls/{proposal['call_id']}", headers=flow.auth())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200
    assert [d["event"] for d in response.json()["decisions"]] == ["proposed", "denied", "denied"]
    assert peak < len(refused.request.content)


async def test_a_call_keeps_its_newest_ten_previews_and_shows_the_latest_two_whole(
    flow: Flow, db: asyncpg.Connection
) -> None:
    proposal = await flow.propose("issue_refund", refund_args())
    previews = [await flow.dry_run(proposal["call_id"]) for _ in range(12)]
    stored = await db.fetch(
        "SELECT id FROM dry_runs WHERE call_id = $1 ORDER BY created_at", proposal["call_id"]
    )
    assert [r["id"] for r in stored] == [p["dry_run_id"] for p in previews[2:]]
    found = (await flow.client.get(f"/calls/{proposal['call_id']}", headers=flow.auth())).json()
    shown = found["dry_runs"]
    assert [d["dry_run_id"] for d in shown] == [p["dry_run_id"] for p in previews[2:]]
    assert [d["snapshot"] is not None for d in shown] == [False] * 8 + [True] * 2
    assert shown[-1]["snapshot"] == previews[-1]["snapshot"]
    assert found["dry_runs_total"] == 10
    assert found["decisions_total"] == len(found["decisions"]) == 13  # proposed, 12 dry-runs
    # The latest preview still decides: it is approved, and the approval runs once.
    approval = await flow.approve(proposal["call_id"], previews[-1]["snapshot_hash"])
    assert approval.status_code == 200, approval.text
    done = await flow.post(
        "/execute", {"call_id": proposal["call_id"]}, headers={"Idempotency-Key": new_key()}
    )
    assert done.json()["status"] == "succeeded", done.text


async def test_a_forgotten_preview_named_by_its_id_is_no_dry_run(flow: Flow) -> None:
    """A low-impact refund requires a dry-run of its arguments: the first of twelve, no
    longer kept, is named in vain; the latest runs it."""
    proposal = await flow.propose("issue_refund", refund_args(30.0))
    previews = [await flow.dry_run(proposal["call_id"]) for _ in range(12)]
    older = await flow.execute(
        "issue_refund", refund_args(30.0), new_key(), dry_run_id=previews[0]["dry_run_id"]
    )
    assert (older.status_code, older.json()["code"]) == (403, "dry_run_required"), older.text
    latest = await flow.execute(
        "issue_refund", refund_args(30.0), new_key(), dry_run_id=previews[-1]["dry_run_id"]
    )
    assert latest.json()["status"] == "succeeded", latest.text


async def test_a_history_stays_bounded_however_large_and_many_the_previews(
    flow: Flow, db: asyncpg.Connection
) -> None:
    """Sixty previews of 800 KB once made one history answer 45 MB."""
    proposal = await flow.propose("issue_refund", refund_args())
    call_id = proposal["call_id"]
    large = {"lines": ["x" * 1000] * 800}  # about 800 KB each
    for n in range(60):
        await db.execute(
            "INSERT INTO dry_runs (id, call_id, tenant, actor, tool, fingerprint,"
            " policy_version, snapshot, snapshot_hash, expires_at)"
            " SELECT $2, id, tenant, actor, tool, fingerprint, policy_version, $3,"
            " 'sha256:' || md5($2), now() + interval '5 minutes' FROM calls WHERE id = $1",
            call_id,
            f"dry_{n:04d}",
            large,
        )
    for _ in range(300):  # a key replayed many times adds an audit row each time
        await db.execute(
            "INSERT INTO audit_events (event, tenant, actor, call_id, tool)"
            " VALUES ('replayed', 'acme', 'alice', $1, 'issue_refund')",
            call_id,
        )
    answer = await flow.client.get(f"/calls/{call_id}", headers=flow.auth())
    assert answer.status_code == 200
    assert len(answer.content) < 2 * 820_000 + 200_000, len(answer.content)
    found = answer.json()
    assert (len(found["dry_runs"]), found["dry_runs_total"]) == (10, 60)
    assert found["dry_runs"][-1]["snapshot"] == large
    assert (len(found["decisions"]), found["decisions_total"]) == (200, 301)


async def test_the_preview_an_approver_decided_on_is_kept_however_many_follow(
    flow: Flow, db: asyncpg.Connection
) -> None:
    """Pruning keeps the newest previews, and what an approver saw stays beside their
    decision: the newest preview of each snapshot an approval of the call binds."""
    proposal = await flow.propose("issue_refund", refund_args())
    call_id = proposal["call_id"]
    seen = await flow.dry_run(call_id)
    assert (await flow.approve(call_id, seen["snapshot_hash"])).status_code == 200
    for n in range(12):  # previews that differ from the approved one
        await db.execute(
            "INSERT INTO dry_runs (id, call_id, tenant, actor, tool, fingerprint,"
            " policy_version, snapshot, snapshot_hash, expires_at)"
            " SELECT $2, id, tenant, actor, tool, fingerprint, policy_version, '{}',"
            " 'sha256:' || md5($2), now() + interval '5 minutes' FROM calls WHERE id = $1",
            call_id,
            f"dry_later_{n:02d}",
        )
    await store.forget_old_dry_runs(db, call_id)
    kept = {r["id"] for r in await db.fetch("SELECT id FROM dry_runs WHERE call_id = $1", call_id)}
    assert kept == {seen["dry_run_id"]} | {f"dry_later_{n:02d}" for n in range(2, 12)}
    found = (await flow.client.get(f"/calls/{call_id}", headers=flow.auth())).json()
    assert (len(found["dry_runs"]), found["dry_runs_total"]) == (10, 11)


async def test_reading_a_history_holds_none_of_its_executions_answers(
    flow: Flow, db: asyncpg.Connection
) -> None:
    """Each execution record keeps the provider's answer, which the history never shows: a
    call executed many times must not make every read of it load them all."""
    proposal = await flow.propose("issue_refund", refund_args())
    call_id = proposal["call_id"]
    large = {"lines": ["x" * 1000] * 800}  # about 800 KB each
    for n in range(10):
        await db.execute(
            "INSERT INTO executions (operation_id, tenant, actor, idempotency_key, call_id,"
            " tool, fingerprint, state, provider_status, response, expires_at)"
            " SELECT $2, tenant, actor, $2, id, tool, fingerprint, 'failed', 500, $3,"
            " now() + interval '1 day' FROM calls WHERE id = $1",
            call_id,
            f"op_{n:02d}",
            large,
        )
    await quiet(db)
    tracemalloc.start()
    try:
        response = await flow.client.get(f"/calls/{call_id}", headers=flow.auth())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200
    executions = response.json()["executions"]
    assert [(x["operation_id"], x["provider_status"]) for x in executions] == [
        (f"op_{n:02d}", 500) for n in range(10)
    ]
    assert peak < 800_000, peak  # less than one answer, let alone ten
