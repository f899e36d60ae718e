"""``/metrics`` tells ops what waits: approvals and their age, the webhook backlog, the
audit sealer's lag and executions whose outcome is unknown; and never fails on them."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import running_app
from tests.flows import Flow, refund_args


def gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found is not None, f"{name} is not in /metrics"
    return float(found.group(1))


async def test_the_backlog_gauges_count_what_waits(
    flow: Flow, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    proposal = await flow.propose("issue_refund", refund_args(150.0))
    await flow.dry_run(proposal["call_id"])  # awaits an approver now
    await db.execute(
        "UPDATE calls SET updated_at = now() - interval '90 seconds' WHERE id = $1",
        proposal["call_id"],
    )
    await db.execute(
        "INSERT INTO webhook_outbox (id, url, event, payload, created_at)"
        " VALUES ('msg_1', 'https://hooks.test/', 'call.executed', '{}', now() - interval '1 hour')"
    )
    await db.execute(
        "INSERT INTO executions (operation_id, tenant, actor, idempotency_key, call_id, tool,"
        " fingerprint, state, expires_at)"
        " SELECT 'op_unknown', tenant, actor, 'key-unknown', id, tool, fingerprint, 'unknown',"
        " now() + interval '1 day' FROM calls WHERE id = $1",
        proposal["call_id"],
    )
    text = (await client.get("/metrics")).text
    assert gauge(text, "toolgate_backlog_up") == 1
    assert gauge(text, "toolgate_pending_approvals") == 1
    assert 90 <= gauge(text, "toolgate_pending_approval_oldest_seconds") < 200
    assert gauge(text, "toolgate_webhook_backlog") == 1
    assert gauge(text, "toolgate_webhook_backlog_oldest_seconds") >= 3600
    assert gauge(text, "toolgate_executions_unknown") == 1
    assert gauge(text, "toolgate_audit_unsealed") >= 0
    assert gauge(text, "toolgate_audit_sealer_lag_seconds") >= 0


async def test_a_database_that_cannot_answer_leaves_metrics_up(
    env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog is read with a short deadline; past it /metrics still answers, and says
    the gauges are stale."""
    from app import exposition as metrics

    monkeypatch.setattr(metrics, "BACKLOG_READ_S", 0.2)
    monkeypatch.setattr(metrics, "_BACKLOG", "SELECT pg_sleep(5)")
    async with running_app(env) as client:
        answer = await client.get("/metrics")
    assert answer.status_code == 200
    assert gauge(answer.text, "toolgate_backlog_up") == 0
