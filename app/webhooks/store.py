"""SQL for the webhook outbox. Rows are written in the caller's transaction (the event's);
the sender's statements are each one short transaction of their own."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from app.catalog.models import Catalog
from app.db import Connection
from app.ids import new_id

APPROVAL_REQUESTED = "approval.requested"
APPROVAL_DECIDED = "approval.decided"
CALL_EXECUTED = "call.executed"
RUN_ENDED = "run.ended"


@dataclass(frozen=True)
class Delivery:
    id: str
    url: str
    event: str
    payload: dict[str, Any]
    attempts: int


async def announce(conn: Connection, catalog: Catalog, event: str, data: dict[str, Any]) -> None:
    """Queue ``event`` for each endpoint the catalog tells of it, in the caller's
    transaction; with no such endpoint (most catalogs), no statement at all."""
    urls = catalog.subscribers(event)
    if not urls:
        return
    payload = {"type": event, "timestamp": datetime.now(UTC).isoformat(), "data": data}
    await conn.executemany(
        "INSERT INTO webhook_outbox (id, url, event, payload) VALUES ($1, $2, $3, $4)",
        [(new_id("msg"), url, event, payload) for url in urls],
    )


def call_data(
    call_id: str, tool: str, tenant: str, actor: str, run_id: str | None, status: str
) -> dict[str, Any]:
    """What an event about a call tells: who, which tool, where it stands; never its
    arguments, which may be sensitive."""
    return {
        "call_id": call_id,
        "tool": tool,
        "tenant": tenant,
        "actor": actor,
        "run_id": run_id,
        "status": status,
    }


def console_url(public_url: str | None, call_id: str) -> str | None:
    """The console's page for a call, where people reach this toolgate; ``None`` when that
    is not configured (``TOOLGATE_PUBLIC_URL``)."""
    return f"{public_url}/console/calls/{quote(call_id, safe='')}" if public_url else None


async def claim(
    conn: Connection, batch: int, lease_s: float, busy: Collection[str] = ()
) -> list[Delivery]:
    """Take up to ``batch`` due deliveries, oldest first, by moving them ``lease_s`` into the
    future: no other sender takes them meanwhile, and if this one dies they come due again.
    Deliveries to the ``busy`` URLs are left for a later pass."""
    rows = await conn.fetch(
        """
        UPDATE webhook_outbox SET attempts = attempts + 1,
            next_at = now() + make_interval(secs => $2)
        WHERE id IN (
            SELECT id FROM webhook_outbox WHERE delivered_at IS NULL AND next_at <= now()
                AND url <> ALL($3::text[])
            ORDER BY next_at LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        RETURNING id, url, event, payload, attempts
        """,
        batch,
        lease_s,
        list(busy),
    )
    return [Delivery(*row) for row in rows]


async def delivered(conn: Connection, delivery_id: str) -> None:
    await conn.execute(
        "UPDATE webhook_outbox SET delivered_at = now(), last_error = NULL WHERE id = $1",
        delivery_id,
    )


async def retry(conn: Connection, delivery_id: str, delay_s: float, error: str) -> None:
    await conn.execute(
        "UPDATE webhook_outbox SET next_at = now() + make_interval(secs => $2), last_error = $3"
        " WHERE id = $1",
        delivery_id,
        delay_s,
        error,
    )


async def drop(conn: Connection, delivery_id: str, after_s: float) -> bool:
    """Remove the delivery if its event is more than ``after_s`` old (by the database's
    clock, the one it was queued by); whether it was."""
    status: str = await conn.execute(
        "DELETE FROM webhook_outbox WHERE id = $1"
        " AND created_at < now() - make_interval(secs => $2)",
        delivery_id,
        after_s,
    )
    return status == "DELETE 1"


async def remove_delivered_before(conn: Connection, before: datetime, limit: int) -> int:
    """Remove up to ``limit`` deliveries the endpoint accepted before ``before``."""
    status = await conn.execute(
        """
        DELETE FROM webhook_outbox WHERE id IN (
            SELECT id FROM webhook_outbox WHERE delivered_at < $1
            ORDER BY delivered_at LIMIT $2)
        """,
        before,
        limit,
    )
    return int(status.split()[-1])
