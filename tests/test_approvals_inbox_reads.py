"""The inbox's decided lists read a page of what the approver may decide, not the tenant's
history: an approver whose calls are rare among the tenant's decisions reads as few rows as
one whose calls fill the page. Counted in the plan PostgreSQL ran (EXPLAIN ANALYZE of the
store's own statement), not timed."""

from __future__ import annotations

import json
from typing import Any, cast

import asyncpg
import pytest

from app.consent import store
from app.consent.rules import Decidable
from app.db import Connection

PAGE = 50
OTHERS = 3000
"""Decisions on other people's refunds, older than none of the approver's: a list that walks
the tenant's decisions until it holds a page of the approver's reads all of them."""

HISTORY = """
WITH made AS (
    INSERT INTO calls (id, tenant, actor, tool, decision, state, policy_version, proposed_by,
                       created_at)
    SELECT call_id, 'acme', actor, tool, 'allow', 'succeeded', 'v', 'model', at
    FROM decided
    RETURNING id
)
INSERT INTO approvals (id, call_id, decision, approver, actor, tenant, tool, policy_version,
                       fingerprint, created_at, expires_at, consumed_by, latest)
SELECT 'apr_' || call_id, call_id, CASE kind WHEN 'rejected' THEN 'reject' ELSE 'approve' END,
       'lead', actor, 'acme', tool, 'v', 'sha256:f', at,
       CASE kind WHEN 'live' THEN now() + interval '290 seconds'
                 ELSE at + interval '300 seconds' END,
       CASE kind WHEN 'used' THEN 'op_' || call_id END, true
FROM decided
"""
DECIDED = f"""
CREATE TEMP TABLE decided AS
SELECT 'call_' || lpad(i::text, 6, '0') AS call_id, 'user' || (i % 97) AS actor,
       'issue_refund' AS tool, (ARRAY['rejected', 'used', 'expired'])[i % 3 + 1] AS kind,
       now() - interval '1 day' + i * interval '1 second' AS at
FROM generate_series(1, {OTHERS}) AS i
UNION ALL
SELECT 'call_live_' || i, 'user' || i, 'issue_refund', 'live', now() - i * interval '1 second'
FROM generate_series(1, 5) AS i
UNION ALL
SELECT call_id, actor, tool, kind, now() - interval '2 days' + n * interval '1 minute'
FROM (VALUES (1, 'call_ann_rejected', 'ann', 'issue_refund', 'rejected'),
             (2, 'call_ann_used', 'ann', 'issue_refund', 'used'),
             (3, 'call_ann_expired', 'ann', 'issue_refund', 'expired'),
             (4, 'call_email_rejected', 'ann', 'update_customer_email', 'rejected'),
             (5, 'call_email_used', 'ann', 'update_customer_email', 'used'),
             (6, 'call_email_expired', 'ann', 'update_customer_email', 'expired'))
     AS own(n, call_id, actor, tool, kind)
"""


class Explaining:
    """A connection that also runs each query it is given under EXPLAIN ANALYZE, keeping the
    plans, so the test counts the rows of the statement the store really sends."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.plans: list[dict[str, Any]] = []

    async def fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        plan = await self.conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
        self.plans.append(json.loads(plan)[0]["Plan"])
        return await self.conn.fetch(sql, *args)


def approvals_read(plan: dict[str, Any]) -> int:
    """Rows of ``approvals`` the plan's scans produced or threw away, over all their loops."""
    rows = 0
    if plan.get("Relation Name") == "approvals":
        per_loop = (
            plan["Actual Rows"]
            + plan.get("Rows Removed by Filter", 0)
            + plan.get("Rows Removed by Index Recheck", 0)
        )
        rows += per_loop * plan["Actual Loops"]
    return rows + sum(approvals_read(child) for child in plan.get("Plans", []))


@pytest.fixture
async def history(db: asyncpg.Connection) -> None:
    await db.execute(DECIDED)
    await db.execute(HISTORY)
    await db.execute("ANALYZE calls; ANALYZE approvals")


@pytest.mark.parametrize(
    ("decidable", "expected"),
    [
        # May decide only their own refunds (``owner``), three among thousands.
        (
            Decidable("ann", others=[], own=["issue_refund"]),
            {
                "approved": ["call_ann_used"],
                "rejected": ["call_ann_rejected"],
                "expired": ["call_ann_expired"],
            },
        ),
        # May decide others' e-mail changes, a tool rare in this tenant.
        (
            Decidable("sam", others=["update_customer_email"], own=[]),
            {
                "approved": ["call_email_used"],
                "rejected": ["call_email_rejected"],
                "expired": ["call_email_expired"],
            },
        ),
    ],
    ids=["owner-only", "rare-tool"],
)
@pytest.mark.parametrize("status", ["approved", "rejected", "expired"])
async def test_a_decided_list_reads_a_page_however_rare_the_approvers_calls_are(
    db: asyncpg.Connection,
    history: None,
    decidable: Decidable,
    expected: dict[str, list[str]],
    status: str,
) -> None:
    """At most a page per tool the approver may decide (one here), plus for ``approved`` the
    approvals still live (five): never the thousands of decisions they may not see."""
    explaining = Explaining(db)

    rows = await store.inbox(cast(Connection, explaining), "acme", decidable, status, None, PAGE)

    assert [row.call_id for row in rows] == expected[status]
    [plan] = explaining.plans
    assert approvals_read(plan) <= PAGE
