"""Removing old history in small batches, one instance at a time.

Why: every decision leaves rows behind (a call, its audit rows, dry-runs, approvals,
execution records, runs, webhook deliveries), and a year of them makes every index, vacuum
and backup larger without serving anyone. What is kept, and for how long, is configuration
(``TOOLGATE_RETENTION_DAYS``, ``TOOLGATE_AUDIT_RETENTION_DAYS``,
``TOOLGATE_WEBHOOK_RETENTION_DAYS``; docs/configuration.md); expired execution records go
as before, once ``TOOLGATE_IDEMPOTENCY_TTL_S`` has passed.

- **Small statements.** Each batch removes at most ``BATCH`` rows of one table, oldest
  first through an index on its time, in a transaction of its own, and the next waits
  ``PAUSE_S``: no statement grows with the backlog, locks are short, WAL comes in small
  pieces, and the requests in between barely notice.
- **One purger at a time across instances.** A session advisory lock taken on a connection
  held for the pass (the reconciler's pattern); another instance skips the pass.
- **The audit trail goes by month.** Its tables are partitioned by month, and a month older
  than the cutoff is dropped whole, from the start of the chain only, after it is written
  to the archive directory when one is configured (``app.audit.archive``). Each pass also
  makes the partitions of the months ahead, as start-up does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from app.audit import archive, checkpoints
from app.calls import store as calls
from app.db import Connection, Database, Lock
from app.errors import Unavailable
from app.runs import store as runs
from app.settings import Settings
from app.webhooks import store as webhooks

EVERY_S = 60.0
BATCH = 1000
PAUSE_S = 0.05
log = logging.getLogger("toolgate")

Remover = Callable[[Connection, int], Awaitable[int]]


async def run(db: Database, settings: Settings) -> None:
    """Audit partitions made at once, then a pass every ``EVERY_S`` for as long as the app
    runs; trouble postpones to the next."""
    try:
        async with db.exclusively(Lock.PURGER) as held:
            if held:
                async with db.connection() as conn:
                    await archive.maintain(conn, datetime.now(UTC))
    except Unavailable as exc:
        log.warning("audit partitions postponed to the first retention pass: %s", exc.detail)
    except Exception:
        log.exception("audit partitions not made; retrying on the first retention pass")
    while True:
        await asyncio.sleep(EVERY_S)
        try:
            removed = await purge(db, settings)
        except Unavailable as exc:
            log.warning("retention pass postponed: %s", exc.detail)
            continue
        except Exception:
            log.exception("retention pass failed; retrying on the next tick")
            continue
        if removed:
            log.info("retention removed %s", ", ".join(f"{n} {t}" for t, n in removed.items()))


def removers(settings: Settings, now: datetime) -> dict[str, Remover]:
    """What to remove under ``settings`` as of ``now``, table by table."""

    def before(days: int) -> datetime:
        return now - timedelta(days=days)

    chosen: dict[str, Remover] = {
        "execution records": calls.purge_expired,
        "remembered windows of ended runs": runs.forget_ended,
    }
    if settings.retention_days:
        cutoff = before(settings.retention_days)
        chosen["calls"] = lambda conn, n: calls.remove_before(conn, cutoff, n)
        chosen["runs"] = lambda conn, n: runs.remove_before(conn, cutoff, n)
    if settings.webhook_retention_days:
        sent = before(settings.webhook_retention_days)
        chosen["webhook deliveries"] = lambda conn, n: webhooks.remove_delivered_before(
            conn, sent, n
        )
    return chosen


async def purge(
    db: Database, settings: Settings, now: datetime | None = None, pause_s: float = PAUSE_S
) -> dict[str, int] | None:
    """One pass: rows removed per table, or ``None`` when another purger holds the lock."""
    async with db.exclusively(Lock.PURGER) as held:
        if not held:
            return None
        async with db.connection() as conn:
            await archive.maintain(conn, datetime.now(UTC))
        now = now or datetime.now(UTC)
        removed = {}
        for table, remove in removers(settings, now).items():
            removed[table] = await _in_batches(db, remove, pause_s)
        if settings.audit_retention_days:
            cutoff = now - timedelta(days=settings.audit_retention_days)
            removed["audit rows"] = await archive.remove_months(
                db,
                cutoff,
                settings.audit_archive_dir,
                retention_days=settings.audit_retention_days,
                key=checkpoints.signing_key(settings),
            )
    return {table: n for table, n in removed.items() if n}


async def _in_batches(db: Database, remove: Remover, pause_s: float) -> int:
    total = 0
    while True:
        async with db.transaction() as conn:
            removed = await remove(conn, BATCH)
        total += removed
        if removed < BATCH:
            return total
        await asyncio.sleep(pause_s)
