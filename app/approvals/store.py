"""SQL for approvals. Consumption is a conditional update: one execution wins."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.approvals.models import ApprovalRow
from app.db import Connection, Insert

_INSERT = Insert.of("approvals", ApprovalRow, ["created_at"])


async def insert(conn: Connection, approval: ApprovalRow) -> None:
    await conn.execute(_INSERT.sql, *_INSERT.values(approval))


async def get(conn: Connection, approval_id: str) -> ApprovalRow | None:
    row = await conn.fetchrow("SELECT * FROM approvals WHERE id = $1", approval_id)
    return ApprovalRow(**dict(row)) if row else None


async def consume(conn: Connection, approval_id: str, operation_id: str) -> bool:
    status = await conn.execute(
        """
        UPDATE approvals SET consumed_by = $2, consumed_at = now()
        WHERE id = $1 AND consumed_by IS NULL AND decision = 'approve' AND expires_at > now()
        """,
        approval_id,
        operation_id,
    )
    return bool(status.endswith(" 1"))


async def release(conn: Connection, operation_id: str) -> None:
    """Give the approval back when its execution certainly never reached the provider."""
    await conn.execute(
        "UPDATE approvals SET consumed_by = NULL, consumed_at = NULL WHERE consumed_by = $1",
        operation_id,
    )


_LATEST_DRY_RUN = """
    LEFT JOIN LATERAL (
        SELECT snapshot, snapshot_hash, created_at, expires_at FROM dry_runs
        WHERE dry_runs.call_id = c.id ORDER BY created_at DESC, id LIMIT 1
    ) d ON true
"""
_INBOX = {
    "pending": f"""
        SELECT c.*, 'pending' AS status, d.snapshot, d.snapshot_hash,
               coalesce(d.created_at, c.created_at) AS requested_at, d.expires_at
        FROM calls c {_LATEST_DRY_RUN}
        WHERE c.tenant = $1 AND c.state = 'awaiting_approval'
          AND (d.expires_at IS NULL OR d.expires_at > now())
    """,
    "approved": f"""
        SELECT c.*, 'approved' AS status, d.snapshot, a.snapshot_hash,
               a.created_at AS requested_at, a.expires_at
        FROM approvals a JOIN calls c ON c.id = a.call_id {_LATEST_DRY_RUN}
        WHERE a.tenant = $1 AND a.decision = 'approve'
          AND (a.consumed_by IS NOT NULL OR a.expires_at > now())
    """,
    "rejected": f"""
        SELECT c.*, 'rejected' AS status, d.snapshot, a.snapshot_hash,
               a.created_at AS requested_at, a.expires_at
        FROM approvals a JOIN calls c ON c.id = a.call_id {_LATEST_DRY_RUN}
        WHERE a.tenant = $1 AND a.decision = 'reject'
    """,
    "expired": f"""
        SELECT c.*, 'expired' AS status, d.snapshot, a.snapshot_hash,
               a.created_at AS requested_at, a.expires_at
        FROM approvals a JOIN calls c ON c.id = a.call_id {_LATEST_DRY_RUN}
        WHERE a.tenant = $1 AND a.decision = 'approve'
          AND a.consumed_by IS NULL AND a.expires_at <= now()
    """,
}


async def inbox(
    conn: Connection, tenant: str, status: str, before: tuple[datetime, str] | None, limit: int
) -> list[dict[str, Any]]:
    """One page of the tenant's approval requests in ``status``, newest first."""
    rows = await conn.fetch(
        f"""
        SELECT * FROM ({_INBOX[status]}) page
        WHERE $2::timestamptz IS NULL OR (requested_at, id) < ($2, $3)
        ORDER BY requested_at DESC, id DESC LIMIT $4
        """,
        tenant,
        before[0] if before else None,
        before[1] if before else "",
        limit,
    )
    return [dict(r) for r in rows]


async def of_call(conn: Connection, call_id: str) -> list[ApprovalRow]:
    rows = await conn.fetch(
        "SELECT * FROM approvals WHERE call_id = $1 ORDER BY created_at, id", call_id
    )
    return [ApprovalRow(**dict(r)) for r in rows]
