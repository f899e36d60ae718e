"""Load realistic history into a toolgate database, then seal it with toolgate's own sealer.

    python bench/history.py --calls 1000000 [--database NAME]

Creates the database (``history_<calls>`` unless named), runs ``toolgate migrate`` on it and
writes, with set-based SQL inside PostgreSQL (``generate_series``; nothing row by row
crosses the wire), ``--calls`` calls spread evenly over ``--days`` (90) up to now, into the
audit trail's month partitions (made first, for every month of that span):

* tenants: every other call is the big tenant's (``acme``, 500 actors); the rest spread
  over ``--tenants`` (5,000) small tenants of 3 actors each;
* tools, in the demo catalog's proportions: 65 % reads, 23 % low-impact tickets,
  8 % refunds (previewed; a third above 100, so approved), 2 % e-mail changes (high impact,
  no preview), 2 % deployments (previewed, approved); 5 % of calls are denied;
* rows a call leaves: its audit rows (``proposed``/``denied``, ``dry_run``, ``approved``,
  ``executed``, every 100th mutation ``failed`` instead, every 1,000th call an ``expired``
  attempt), dry-runs and approvals where its tool has them, an execution record for a
  mutation of the last 7 days (older ones were purged), every 10th call of the big tenant
  in a run (20 calls per run), 1 % of the approval-needing calls abandoned while awaiting
  approval, and a delivered webhook per 100 calls;
* ids as toolgate makes them (time first), times in the order the seqs run.

Then it drains the audit backlog with ``app.audit.sealer.seal_pending`` (the sealer's own
pass, default batch), printing the rate, times idle passes on the unvacuumed table and again
after ``VACUUM ANALYZE``, and checks the chain with ``toolgate audit verify``. Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.audit import sealer, store
from app.db import Database

HISTORY = """
-- The audit trail's month partitions for the whole history (migrate makes this month's on).
SELECT audit_partitions(month::date) FROM generate_series(
    date_trunc('month', (now() - make_interval(days => {days})) AT TIME ZONE 'UTC'),
    date_trunc('month', now() AT TIME ZONE 'UTC'), interval '1 month') AS month;

CREATE TEMP TABLE h AS
SELECT i,
    now() - make_interval(days => {days}) + (i - 1) * make_interval(secs => {step}) AS at,
    CASE WHEN i % 2 = 0 THEN 'acme' ELSE 't' || ((i / 2) % {tenants}) END AS tenant,
    CASE WHEN i % 2 = 0 THEN 'user' || ((i * 7919) % 500) ELSE 'user' || (i % 3) END AS actor,
    CASE
        WHEN i % 20 = 7 THEN 'denied'
        WHEN (i * 37) % 100 < 40 THEN 'get_order'
        WHEN (i * 37) % 100 < 55 THEN 'get_ticket'
        WHEN (i * 37) % 100 < 65 THEN 'get_customer'
        WHEN (i * 37) % 100 < 80 THEN 'create_ticket'
        WHEN (i * 37) % 100 < 88 THEN 'add_ticket_comment'
        WHEN (i * 37) % 100 < 96 THEN 'issue_refund'
        WHEN (i * 37) % 100 < 98 THEN 'update_customer_email'
        ELSE 'deploy_service'
    END AS kind,
    lpad(to_hex((extract(epoch FROM now() - make_interval(days => {days})
        + (i - 1) * make_interval(secs => {step})) * 1000)::bigint), 12, '0') AS stamp,
    substr(md5('x' || i), 1, 20) AS noise
FROM generate_series(1::bigint, {calls}) i;

ALTER TABLE h ADD COLUMN tool text, ADD COLUMN mutation boolean, ADD COLUMN impact text,
    ADD COLUMN previewed boolean, ADD COLUMN approved boolean, ADD COLUMN abandoned boolean,
    ADD COLUMN run_id text, ADD COLUMN call_id text;
UPDATE h SET
    tool = CASE WHEN kind = 'denied' THEN 'issue_refund' ELSE kind END,
    mutation = kind NOT LIKE 'get\\_%',
    impact = CASE
        WHEN kind LIKE 'get\\_%' THEN 'read'
        WHEN kind IN ('update_customer_email', 'deploy_service') THEN 'high'
        WHEN kind = 'issue_refund' AND i % 3 = 0 THEN 'high'
        ELSE 'low' END,
    previewed = kind IN ('issue_refund', 'deploy_service'),
    call_id = 'call_' || stamp || noise,
    run_id = CASE WHEN i % 10 = 0 THEN 'run_' || stamp || substr(md5('r' || (i / 200)), 1, 20)
        END;
UPDATE h SET approved = impact = 'high' AND i % 100 <> 1,
    abandoned = impact = 'high' AND i % 100 = 1;
-- A run's id is the one its first call carries.
UPDATE h SET run_id = f.run_id FROM (
    SELECT DISTINCT ON (i / 200) i / 200 AS r, run_id FROM h WHERE run_id IS NOT NULL
    ORDER BY i / 200, i) f
WHERE h.run_id IS NOT NULL AND h.i / 200 = f.r;

INSERT INTO runs (id, tenant, actor, task, status, max_calls, max_seconds, max_cost,
    max_repeats, max_failures, calls, created_at, updated_at, finished_at)
SELECT DISTINCT ON (run_id) run_id, tenant, actor, 'bench history', 'completed', 100, 3600,
    100, 3, 5, 20, at, at, at + interval '5 minutes'
FROM h WHERE run_id IS NOT NULL ORDER BY run_id, i;

INSERT INTO calls (id, tenant, actor, tool, run_id, tool_call_id, arguments, fingerprint,
    target_type, target_id, mutation, impact, decision, code, reason, next, state,
    policy_version, proposed_by, authorized_by, pending_until, created_at, updated_at)
SELECT call_id, tenant, actor, tool, run_id, NULL,
    jsonb_build_object('order_id', 'ord_' || (i % 100000), 'amount', (i % 500) + 0.5),
    'sha256:' || md5('f' || i) || md5('g' || i), 'order', 'ord_' || (i % 100000), mutation,
    CASE WHEN kind = 'denied' THEN NULL ELSE impact END,
    CASE WHEN kind = 'denied' THEN 'deny' ELSE 'allow' END,
    CASE WHEN kind = 'denied' THEN 'tool_forbidden' END,
    CASE WHEN kind = 'denied' THEN 'the order belongs to another tenant' END,
    CASE WHEN kind = 'denied' THEN NULL WHEN approved OR abandoned THEN 'approval'
        WHEN previewed THEN 'dry_run' ELSE 'execute' END,
    CASE WHEN kind = 'denied' THEN 'denied' WHEN abandoned THEN 'awaiting_approval'
        ELSE 'succeeded' END,
    '2026-11-29#9f2c1a', 'model',
    jsonb_build_object('kind', 'policy', 'sub', actor, 'tenant', tenant,
        'policy_version', '2026-11-29#9f2c1a'),
    CASE WHEN abandoned THEN at + interval '300 seconds' END, at, at
FROM h ORDER BY i;

INSERT INTO dry_runs (id, call_id, tenant, actor, tool, fingerprint, policy_version, snapshot,
    snapshot_hash, created_at, expires_at)
SELECT 'dry_' || stamp || noise, call_id, tenant, actor, tool, 'sha256:' || md5('f' || i),
    '2026-11-29#9f2c1a', jsonb_build_object('refund', (i % 500) + 0.5, 'currency', 'EUR'),
    'sha256:' || md5('s' || i) || md5('t' || i), at + interval '1 second',
    at + interval '301 seconds'
FROM h WHERE previewed ORDER BY i;

INSERT INTO approvals (id, call_id, decision, approver, comment, actor, tenant, tool,
    target_type, target_id, policy_version, fingerprint, snapshot_hash, created_at,
    expires_at, consumed_by, consumed_at, latest)
SELECT 'apr_' || stamp || noise, call_id, 'approve', 'lead', NULL, actor, tenant, tool,
    'order', 'ord_' || (i % 100000), '2026-11-29#9f2c1a', 'sha256:' || md5('f' || i),
    CASE WHEN previewed THEN 'sha256:' || md5('s' || i) || md5('t' || i) END,
    at + interval '30 seconds', at + interval '330 seconds', 'op_' || stamp || noise,
    at + interval '40 seconds', true
FROM h WHERE approved ORDER BY i;

INSERT INTO executions (operation_id, tenant, actor, idempotency_key, call_id, tool,
    target_type, target_id, fingerprint, approval_id, state, provider_status, response,
    created_at, updated_at, expires_at)
SELECT 'op_' || stamp || noise, tenant, actor, 'key-' || noise, call_id, tool, 'order',
    'ord_' || (i % 100000), 'sha256:' || md5('f' || i),
    CASE WHEN approved THEN 'apr_' || stamp || noise END, 'succeeded', 201,
    jsonb_build_object('status', 200, 'body', jsonb_build_object('id', 'tkt_' || i)),
    at + interval '40 seconds', at + interval '41 seconds', at + interval '1 day'
FROM h WHERE mutation AND kind <> 'denied' AND NOT abandoned
    AND at > now() - interval '7 days' ORDER BY i;

INSERT INTO webhook_outbox (id, url, event, payload, attempts, next_at, delivered_at,
    created_at)
SELECT 'whk_' || stamp || noise, 'https://hooks.example.com/toolgate', 'call.executed',
    jsonb_build_object('call_id', call_id), 1, at, at + interval '1 second', at
FROM h WHERE i % 100 = 0 ORDER BY i;

INSERT INTO audit_events (at, event, call_id, run_id, tenant, actor, tool, target,
    fingerprint, arguments, decision, code, reason, policy_version, approval_id,
    proposed_by, authorized_by, outcome, total_ms, provider_ms)
SELECT h.at + e.ms * interval '1 millisecond', e.event, call_id, run_id, tenant, actor, tool,
    jsonb_build_object('type', 'order', 'id', 'ord_' || (i % 100000)),
    'sha256:' || md5('f' || i) || md5('g' || i),
    jsonb_build_object('order_id', 'ord_' || (i % 100000), 'amount', (i % 500) + 0.5),
    CASE WHEN e.event IN ('denied', 'expired', 'failed') THEN 'deny' ELSE 'allow' END,
    CASE e.event WHEN 'denied' THEN 'tool_forbidden' WHEN 'expired' THEN 'approval_expired'
        WHEN 'failed' THEN 'provider_unavailable' END,
    CASE e.event WHEN 'denied' THEN 'the order belongs to another tenant' END,
    '2026-11-29#9f2c1a',
    CASE WHEN e.event IN ('approved', 'executed') AND approved
        THEN 'apr_' || stamp || noise END,
    'model',
    jsonb_build_object('kind', 'policy', 'sub', actor, 'tenant', tenant,
        'policy_version', '2026-11-29#9f2c1a'),
    CASE WHEN e.event = 'executed'
        THEN jsonb_build_object('status', 'succeeded', 'provider_status', 200) END,
    CASE WHEN e.event IN ('executed', 'failed') THEN 12.5 END,
    CASE WHEN e.event IN ('executed', 'failed') THEN 8.25 END
FROM h CROSS JOIN LATERAL (VALUES
    (0, CASE WHEN kind = 'denied' THEN 'denied' WHEN mutation THEN 'proposed' END),
    (1, CASE WHEN previewed AND kind <> 'denied' THEN 'dry_run' END),
    (30, CASE WHEN approved THEN 'approved' END),
    (35, CASE WHEN i % 1000 = 3 AND kind <> 'denied' THEN 'expired' END),
    (40, CASE WHEN kind = 'denied' OR abandoned THEN NULL
        WHEN mutation AND i % 100 = 9 THEN 'failed' ELSE 'executed' END)
) AS e(ms, event)
WHERE e.event IS NOT NULL
ORDER BY i, e.ms;
"""


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--tenants", type=int, default=5000)
    parser.add_argument("--database", help="database to create (default history_<calls>)")
    parser.add_argument(
        "--step",
        choices=["load", "seal", "all"],
        default="all",
        help="load only, seal (and verify) an already loaded database only, or both",
    )
    parser.add_argument(
        "--postgres", default="postgresql://postgres@127.0.0.1:5432", help="server URL, no db"
    )
    return parser.parse_args()


async def load(server: str, name: str, calls: int, days: int, tenants: int) -> None:
    admin = await asyncpg.connect(server + "/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = f"{server}/{name}"
    env = {**os.environ, "TOOLGATE_DATABASE_URL": url}
    subprocess.run([_toolgate(), "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    if not calls:
        return
    conn = await asyncpg.connect(url)
    try:
        started = time.monotonic()
        step = days * 86400 / calls
        await conn.execute(HISTORY.format(days=days, step=step, tenants=tenants, calls=calls))
        print(f"loaded in {time.monotonic() - started:.0f} s:", flush=True)
        for table in ("calls", "audit_events", "dry_runs", "approvals", "executions", "runs"):
            count = await conn.fetchval(f"SELECT count(*) FROM {table}")
            print(f"  {table:14} {count:>10,}", flush=True)
    finally:
        await conn.close()


async def drain(url: str) -> None:
    """Seal the whole backlog with the sealer's own passes; time them and idle passes."""
    db = Database(url)
    await db.open(min_size=1, max_size=2)
    try:
        async with db.connection() as conn:
            backlog = await store.unsealed_count(conn)
        started, sealed, passes = time.monotonic(), 0, []
        while True:
            t0 = time.monotonic()
            result = await sealer.seal_pending(db)
            passes.append(time.monotonic() - t0)
            sealed += result.sealed
            if not result.more:
                break
        elapsed = time.monotonic() - started
        print(
            f"sealer: {sealed:,} of a {backlog:,}-row backlog in {elapsed:.1f} s = "
            f"{sealed / elapsed:,.0f} rows/s ({len(passes)} passes of {sealer.BATCH}, "
            f"median {1000 * statistics.median(passes):.1f} ms, "
            f"max {1000 * max(passes):.1f} ms)",
            flush=True,
        )
        await _idle(db, "idle passes before VACUUM")
        conn = await asyncpg.connect(url)  # no statement timeout, unlike the app's pool
        try:
            t0 = time.monotonic()
            await conn.execute("VACUUM ANALYZE")
            print(f"VACUUM ANALYZE: {time.monotonic() - t0:.0f} s", flush=True)
        finally:
            await conn.close()
        await _idle(db, "idle passes after VACUUM")
    finally:
        await db.close()


async def _idle(db: Database, label: str) -> None:
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        result = await sealer.seal_pending(db)
        times.append(time.perf_counter() - t0)
        assert result.sealed == 0, result
    print(
        f"{label}: median {1000 * statistics.median(times):.2f} ms, "
        f"max {1000 * max(times):.2f} ms per pass ({1 / sealer.EVERY_S:.0f} passes/s idle)",
        flush=True,
    )


def verify(url: str) -> None:
    env = {**os.environ, "TOOLGATE_DATABASE_URL": url}
    t0 = time.monotonic()
    done = subprocess.run([_toolgate(), "audit", "verify"], env=env, capture_output=True)
    print(f"toolgate audit verify: exit {done.returncode} in {time.monotonic() - t0:.0f} s")
    print("  " + (done.stdout or done.stderr).decode().strip().replace("\n", "\n  "))


def _toolgate() -> str:
    return str(Path(sys.executable).parent / "toolgate")


def main() -> int:
    ns = _args()
    name = ns.database or f"history_{ns.calls}"
    url = f"{ns.postgres}/{name}"
    if ns.step in ("load", "all"):
        asyncio.run(load(ns.postgres, name, ns.calls, ns.days, ns.tenants))
    if ns.step in ("seal", "all"):
        asyncio.run(drain(url))
        verify(url)
    print(f"database: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
