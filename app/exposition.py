"""``GET /metrics``: the Prometheus exposition of ``app.metrics``' series, and the backlog
gauges, read from the database at each scrape (what waits: approvals, webhooks, the audit
sealer, executions with an unknown outcome). They are the same for every process, so with
several workers the highest answer stands (``multiprocess_mode="max"``).
"""

from __future__ import annotations

import asyncio
import os

from fastapi import APIRouter, Response
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.multiprocess import MultiProcessCollector

from app.audit import store as audit
from app.db import Connection
from app.deps import State
from app.errors import ToolgateError
from app.responses import problems

BACKLOG_READ_S = 1.0
"""How long a scrape waits for them; past it (or with the database down) they keep the
values last read and ``toolgate_backlog_up`` is 0: /metrics itself never fails or hangs on
them."""
BACKLOG_UP = Gauge(
    "toolgate_backlog_up",
    "1 when the backlog gauges below were read at this scrape, 0 when the database could not "
    "answer in time.",
    multiprocess_mode="max",
)
PENDING_APPROVALS = Gauge(
    "toolgate_pending_approvals",
    "Calls awaiting an approver's decision, their approval window open.",
    multiprocess_mode="max",
)
PENDING_APPROVAL_AGE = Gauge(
    "toolgate_pending_approval_oldest_seconds",
    "How long the oldest of them has waited (0 when none waits).",
    multiprocess_mode="max",
)
WEBHOOK_BACKLOG = Gauge(
    "toolgate_webhook_backlog",
    "Webhook deliveries not yet accepted by their endpoint.",
    multiprocess_mode="max",
)
WEBHOOK_AGE = Gauge(
    "toolgate_webhook_backlog_oldest_seconds",
    "Age of the oldest undelivered webhook (0 when none).",
    multiprocess_mode="max",
)
UNSEALED = Gauge(
    "toolgate_audit_unsealed",
    "Audit rows waiting for the sealer (above the chain head).",
    multiprocess_mode="max",
)
SEALER_LAG = Gauge(
    "toolgate_audit_sealer_lag_seconds",
    "Age of the oldest audit row waiting for the sealer (0 when none): sealing has stopped "
    "when it keeps growing.",
    multiprocess_mode="max",
)
UNKNOWN_OUTCOMES = Gauge(
    "toolgate_executions_unknown",
    "Executions whose outcome is unknown (sent, no answer), waiting for reconciliation.",
    multiprocess_mode="max",
)
_BACKLOG = """
    WITH p AS (SELECT updated_at FROM calls
               WHERE state = 'awaiting_approval' AND pending_until > now()),
         w AS (SELECT created_at FROM webhook_outbox WHERE delivered_at IS NULL)
    SELECT (SELECT count(*) FROM p) AS pending,
           coalesce((SELECT extract(epoch FROM now() - min(updated_at)) FROM p), 0)
               AS pending_age,
           (SELECT count(*) FROM w) AS webhooks,
           coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM w), 0)
               AS webhook_age,
           (SELECT count(*) FROM executions WHERE state = 'unknown') AS unknown
"""


async def _backlog(conn: Connection) -> None:
    row = await conn.fetchrow(_BACKLOG)
    assert row is not None  # a SELECT without FROM returns one row
    rows, lag = await audit.sealer_lag(conn)
    PENDING_APPROVALS.set(row["pending"])
    PENDING_APPROVAL_AGE.set(float(row["pending_age"]))
    WEBHOOK_BACKLOG.set(row["webhooks"])
    WEBHOOK_AGE.set(float(row["webhook_age"]))
    UNKNOWN_OUTCOMES.set(row["unknown"])
    UNSEALED.set(rows)
    SEALER_LAG.set(lag)


router = APIRouter()


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        **problems(),
        200: {
            "description": "Prometheus text exposition",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
    },
)
async def metrics(state: State) -> Response:
    """Prometheus text, no authentication. The backlog gauges are read from the database
    first, for at most a second (``toolgate_backlog_up`` says whether they were)."""
    try:
        async with asyncio.timeout(BACKLOG_READ_S), state.db.connection() as conn:
            await _backlog(conn)
        BACKLOG_UP.set(1)
    except (TimeoutError, ToolgateError, OSError):
        BACKLOG_UP.set(0)
    text = await asyncio.to_thread(generate_latest, _registry())
    return Response(text, media_type=CONTENT_TYPE_PLAIN_0_0_4)


def _registry() -> CollectorRegistry:
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry
