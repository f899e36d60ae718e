"""SQL for approvals. Consumption is a conditional update: one execution wins."""

from __future__ import annotations

from datetime import datetime

from app.consent.models import ApprovalRow, InboxRow
from app.consent.rules import Decidable
from app.db import Connection, Insert, columns

_INSERT = Insert.of("approvals", ApprovalRow._fields, ["created_at"])
_COLUMNS = columns(ApprovalRow)


async def insert(conn: Connection, approval: ApprovalRow) -> None:
    """Store a decision as its call's latest one. Under the call's lock
    (``calls.store.lock``), so each call has one latest decision."""
    await conn.execute(
        "UPDATE approvals SET latest = false WHERE call_id = $1 AND latest", approval.call_id
    )
    await conn.execute(_INSERT.sql, *_INSERT.values(approval))


async def get(conn: Connection, approval_id: str) -> ApprovalRow | None:
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM approvals WHERE id = $1", approval_id)
    return ApprovalRow(*row) if row else None


async def standing(conn: Connection, call_id: str) -> list[ApprovalRow]:
    """The decisions on a call that bear on a new one, a rejection first: its rejection,
    approvals an execution consumed, and its live approval. Liveness is judged by the
    database's clock, as consumption is. Read under the call's lock (``calls.store.lock``)."""
    rows = await conn.fetch(
        f"""
        SELECT {_COLUMNS} FROM approvals
        WHERE call_id = $1
          AND (decision = 'reject' OR consumed_by IS NOT NULL OR expires_at > now())
        ORDER BY decision = 'reject' DESC, created_at, id
        """,
        call_id,
    )
    return [ApprovalRow(*r) for r in rows]


async def consume(conn: Connection, approval_id: str, operation_id: str, quorum: int) -> bool:
    """Use the approval for ``operation_id``, with every approval of its call that agrees
    with it (bound to the same; ``rules.repeated`` keeps one per approver), and only if
    ``quorum`` approvers or more gave them, each approved, unexpired and unused, and the call
    was neither rejected nor run on other approvals. The caller has moved the call to
    executing in this transaction, which locks the call's row: two executions of one call
    take turns, and the second sees the first's consumption here."""
    status = await conn.execute(
        """
        WITH agreeing AS (
            SELECT other.id, other.approver FROM approvals chosen JOIN approvals other
              ON other.call_id = chosen.call_id AND other.decision = 'approve'
             AND other.consumed_by IS NULL AND other.expires_at > now()
             AND other.fingerprint = chosen.fingerprint
             AND other.snapshot_hash IS NOT DISTINCT FROM chosen.snapshot_hash
             AND other.policy_version = chosen.policy_version
            WHERE chosen.id = $1 AND chosen.decision = 'approve'
              AND chosen.consumed_by IS NULL AND chosen.expires_at > now()
              AND NOT EXISTS (
                  SELECT 1 FROM approvals used
                  WHERE used.call_id = chosen.call_id
                    AND (used.decision = 'reject' OR used.consumed_by IS NOT NULL)
              )
        )
        UPDATE approvals SET consumed_by = $2, consumed_at = now()
        WHERE id IN (SELECT id FROM agreeing)
          AND (SELECT count(DISTINCT approver) FROM agreeing) >= $3
        """,
        approval_id,
        operation_id,
        quorum,
    )
    return int(status.rsplit(" ", 1)[1]) > 0  # all of them, the chosen one among them, or none


async def release(conn: Connection, approval_id: str, operation_id: str) -> None:
    """Give the approvals back when their execution certainly never reached the provider
    (by the call of ``approval_id``: nothing indexes ``consumed_by``)."""
    await conn.execute(
        "UPDATE approvals SET consumed_by = NULL, consumed_at = NULL"
        " WHERE call_id = (SELECT call_id FROM approvals WHERE id = $1) AND consumed_by = $2",
        approval_id,
        operation_id,
    )


_LATEST_DRY_RUN = """
    LEFT JOIN LATERAL (
        SELECT snapshot, snapshot_hash, created_at, expires_at FROM dry_runs
        WHERE dry_runs.call_id = c.id ORDER BY created_at DESC, id LIMIT 1
    ) d ON true
"""


_DECIDABLE = "((tool = ANY($6::text[]) AND actor <> $5) OR (tool = ANY($7::text[]) AND actor = $5))"
"""The calls the approver may decide (``rules.Decidable``: $5 the approver, $6 the tools of
which they may decide others' calls, $7 those of which they may decide their own). A call
and its approvals carry the same ``tool`` and ``actor``. Filtered here, before a page is cut,
so that a page is filled with what the approver may decide and ends on one of them."""

_BEFORE = "(created_at, call_id) < (coalesce($2::timestamptz, 'infinity'), $3)"
"""Before the cursor ($2, $3), in the inbox's order."""


def _per_tool(tools: str, whose: str, kind: str) -> str:
    """For each tool in the array ``tools``, a page of the tenant's standing decisions of
    ``kind`` on calls ``whose`` admits, newest first, through the kind's index by tool or by
    actor (migration 0017): each reads at most a page, however rare the tool is."""
    return f"""
        SELECT p.* FROM unnest({tools}::text[]) AS t(tool), LATERAL (
            SELECT call_id, snapshot_hash, created_at, expires_at FROM approvals
            WHERE tenant = $1 AND tool = t.tool AND {whose} AND latest AND {kind}
              AND {_BEFORE}
            ORDER BY created_at DESC, call_id DESC LIMIT $4
        ) p
    """


def _decided(status: str, kind: str) -> str:
    """A page of the tenant's standing decisions of ``kind`` that the approver may decide
    (``_DECIDABLE``, one tool at a time), newest first: the pages per tool merged. Others'
    calls of a tool are read by tool, skipping only the approver's own calls of it."""
    return f"""(
        SELECT call_id, snapshot_hash, created_at, expires_at, '{status}' AS status
        FROM ({_per_tool("$6", "actor <> $5", kind)}
              UNION ALL {_per_tool("$7", "actor = $5", kind)}) mine
        ORDER BY created_at DESC, call_id DESC LIMIT $4
    )"""


_UNUSED = "decision = 'approve' AND consumed_by IS NULL"
_LIVE = f"""(
    SELECT call_id, snapshot_hash, created_at, expires_at, 'approved' AS status
    FROM approvals
    WHERE tenant = $1 AND latest AND {_UNUSED} AND expires_at > now() AND {_DECIDABLE}
      AND {_BEFORE}
    ORDER BY created_at DESC, call_id DESC LIMIT $4
)"""
"""A page of the unused approvals still live that the approver may decide, read by expiry
(``approvals_live``): only those inside their window, as for pending calls."""
_DECIDED = {
    "approved": [_decided("approved", "decision = 'approve' AND consumed_by IS NOT NULL"), _LIVE],
    "rejected": [_decided("rejected", "decision = 'reject'")],
    "expired": [_decided("expired", f"{_UNUSED} AND expires_at <= now()")],
}
"""Each call's standing decision: its rejection, which is final, or else its latest
approval (a call is approved again only after its approval expired unused). An approval
that was used stays approved."""
_INBOX = {
    "pending": f"""
        SELECT c.*, 'pending' AS status, d.snapshot, d.snapshot_hash,
               coalesce(d.created_at, c.created_at) AS requested_at,
               c.pending_until AS expires_at
        FROM calls c {_LATEST_DRY_RUN}
        WHERE c.tenant = $1 AND c.state = 'awaiting_approval' AND c.pending_until > now()
          AND {_DECIDABLE}
          AND NOT EXISTS (
              SELECT 1 FROM approvals mine
              WHERE mine.call_id = c.id AND mine.approver = $5 AND mine.decision = 'approve'
                AND mine.consumed_by IS NULL AND mine.expires_at > now()
                AND mine.snapshot_hash IS NOT DISTINCT FROM d.snapshot_hash
          )
    """,
    **{
        status: f"""
            SELECT c.*, a.snapshot_hash, a.created_at AS requested_at, a.expires_at,
                   d.snapshot, a.status
            FROM ({" UNION ALL ".join(pages)}) a JOIN calls c ON c.id = a.call_id
            {_LATEST_DRY_RUN}
        """
        for status, pages in _DECIDED.items()
    },
}


async def inbox(
    conn: Connection,
    tenant: str,
    decidable: Decidable,
    status: str,
    before: tuple[datetime, str] | None,
    limit: int,
) -> list[InboxRow]:
    """One page of the tenant's approval requests in ``status`` that ``decidable`` admits,
    newest first, each with how many approvers agree on its preview (``given``). A pending
    request the approver already approved (one of a quorum) is not theirs to decide again."""
    rows = await conn.fetch(
        f"""
        SELECT id, tool, actor, tenant, target_type, target_id, arguments, impact, snapshot,
               snapshot_hash, requested_at, expires_at, status, taint, endorsement,
               (SELECT count(DISTINCT x.approver) FROM approvals x
                WHERE x.call_id = page.id AND x.decision = 'approve'
                  AND x.snapshot_hash IS NOT DISTINCT FROM page.snapshot_hash
                  AND (x.consumed_by IS NOT NULL OR x.expires_at > now())) AS given
        FROM ({_INBOX[status]}) page
        WHERE (requested_at, id) < (coalesce($2::timestamptz, 'infinity'), $3)
        ORDER BY requested_at DESC, id DESC LIMIT $4
        """,
        tenant,
        before[0] if before else None,
        before[1] if before else "",
        limit,
        decidable.approver,
        decidable.others,
        decidable.own,
    )
    return [InboxRow(*r) for r in rows]


async def of_call(conn: Connection, call_id: str) -> list[ApprovalRow]:
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM approvals WHERE call_id = $1 ORDER BY created_at, id", call_id
    )
    return [ApprovalRow(*r) for r in rows]
