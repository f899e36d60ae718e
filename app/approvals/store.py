"""SQL for approvals. Consumption is a conditional update: one execution wins."""

from __future__ import annotations

from datetime import datetime

from app.approvals.models import ApprovalRow, InboxRow
from app.db import Connection, Insert

_INSERT = Insert.of("approvals", ApprovalRow, ["created_at"])


async def insert(conn: Connection, approval: ApprovalRow) -> None:
    await conn.execute(_INSERT.sql, *_INSERT.values(approval))


async def get(conn: Connection, approval_id: str) -> ApprovalRow | None:
    row = await conn.fetchrow("SELECT * FROM approvals WHERE id = $1", approval_id)
    return ApprovalRow(**dict(row)) if row else None


async def standing(conn: Connection, call_id: str) -> list[ApprovalRow]:
    """The decisions on a call that bear on a new one, a rejection first: its rejection,
    approvals an execution consumed, and its live approval. Liveness is judged by the
    database's clock, as consumption is. Read under the call's lock (``calls.store.lock``)."""
    rows = await conn.fetch(
        """
        SELECT * FROM approvals
        WHERE call_id = $1
          AND (decision = 'reject' OR consumed_by IS NOT NULL OR expires_at > now())
        ORDER BY decision = 'reject' DESC, created_at, id
        """,
        call_id,
    )
    return [ApprovalRow(**dict(r)) for r in rows]


async def consume(conn: Connection, approval_id: str, operation_id: str) -> bool:
    """Use the approval for ``operation_id``: only if it is approved, unexpired and unused,
    and its call was neither rejected nor run on another approval. The caller has moved the
    call to executing in this transaction, which locks the call's row: two executions of
    one call take turns, and the second sees the first's consumption here."""
    status = await conn.execute(
        """
        UPDATE approvals SET consumed_by = $2, consumed_at = now()
        WHERE id = $1 AND consumed_by IS NULL AND decision = 'approve' AND expires_at > now()
          AND NOT EXISTS (
              SELECT 1 FROM approvals other
              WHERE other.call_id = approvals.call_id AND other.id <> approvals.id
                AND (other.decision = 'reject' OR other.consumed_by IS NOT NULL)
          )
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
_LATEST_APPROVAL = """
    FROM (
        SELECT DISTINCT ON (call_id) * FROM approvals WHERE tenant = $1
        ORDER BY call_id, decision = 'reject' DESC, created_at DESC, id DESC
    ) a JOIN calls c ON c.id = a.call_id
"""
"""Each call's standing decision: its rejection, which is final, or else its latest
approval (a call is approved again only after its approval expired unused)."""
_DECIDED = f"""
    SELECT c.*, a.snapshot_hash, a.created_at AS requested_at, a.expires_at, d.snapshot,
        CASE
            WHEN a.decision = 'reject' THEN 'rejected'
            WHEN a.consumed_by IS NOT NULL OR a.expires_at > now() THEN 'approved'
            ELSE 'expired'
        END AS status
    {_LATEST_APPROVAL} {_LATEST_DRY_RUN}
"""
_INBOX = {
    "pending": f"""
        SELECT c.*, 'pending' AS status, d.snapshot, d.snapshot_hash,
               coalesce(d.created_at, c.created_at) AS requested_at,
               c.pending_until AS expires_at
        FROM calls c {_LATEST_DRY_RUN}
        WHERE c.tenant = $1 AND c.state = 'awaiting_approval' AND c.pending_until > now()
    """,
    **{
        status: f"SELECT * FROM ({_DECIDED}) decided WHERE status = '{status}'"
        for status in ("approved", "rejected", "expired")
    },
}


async def inbox(
    conn: Connection, tenant: str, status: str, before: tuple[datetime, str] | None, limit: int
) -> list[InboxRow]:
    """One page of the tenant's approval requests in ``status``, newest first."""
    rows = await conn.fetch(
        f"""
        SELECT id, tool, actor, tenant, target_type, target_id, arguments, impact, snapshot,
               snapshot_hash, requested_at, expires_at, status, taint
        FROM ({_INBOX[status]}) page
        WHERE $2::timestamptz IS NULL OR (requested_at, id) < ($2, $3)
        ORDER BY requested_at DESC, id DESC LIMIT $4
        """,
        tenant,
        before[0] if before else None,
        before[1] if before else "",
        limit,
    )
    return [InboxRow(*r) for r in rows]


async def of_call(conn: Connection, call_id: str) -> list[ApprovalRow]:
    rows = await conn.fetch(
        "SELECT * FROM approvals WHERE call_id = $1 ORDER BY created_at, id", call_id
    )
    return [ApprovalRow(**dict(r)) for r in rows]
