"""Sealing committed audit rows into the hash chain, off the request path.

Why not hash on insert: chaining a row to "the previous row" inside the request's own
transaction would make every audit write wait for the last one to commit, a global lock on
every decision across every instance. Instead request transactions only INSERT
(``store.append``; ``seq`` comes from a bigserial) and commit as they always did, and a
sealer writes ``chain_pos``/``prev_hash``/``hash`` onto committed rows right after.

- **One sealer at a time.** Each pass runs in one transaction under
  ``pg_try_advisory_xact_lock``; an instance that finds it taken retries shortly, since the
  holder may have started before its rows committed. A pass either seals its whole batch
  and moves the chain head, or (on any error) nothing.
- **In sequence order, contiguously.** A bigserial value is taken at insert but visible at
  commit, so seq 7 can be visible while 6 is still in flight; a rolled-back 6 never appears.
  A pass seals only the run of seqs following ``sealed_through`` and stops at a missing one.
  Once the row after the gap is older than ``GRACE_S``, the gap is recorded in
  ``audit_gaps`` and passed over. A row whose seq was passed over but that commits after all
  (a transaction open for longer than the grace period) is sealed at the end of the chain:
  the chain is ordered by ``chain_pos`` (sealing order), not by seq, so verify tells a
  skipped seq (no sealed row ever held it) from a deleted row (a hole in ``chain_pos``, a
  broken ``prev_hash`` link, or a chain shorter than its recorded head).
- **Promptly.** ``WakeSealer`` wakes this instance's sealer once a request that may have
  written audit rows has been answered (its transactions are committed by then), and a
  periodic tick covers rows committed by other instances, grace expiries and missed wakes.
  Wake-ups within ``COALESCE_S`` share one pass, so a busy instance runs a handful of
  passes a second, not one per request. Only the pass itself serializes, never a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app.audit import chain, store
from app.audit.models import ChainHead
from app.db import Database
from app.errors import Unavailable

GRACE_S = 5.0
TICK_S = 1.0
COALESCE_S = 0.1
"""After a wake-up, wait this long so a burst of requests is sealed in one pass."""
BATCH = 500
BUSY_RETRY_S = 0.05
BUSY_RETRIES = 40
log = logging.getLogger("toolgate.audit")


@dataclass(frozen=True)
class Pass:
    """What one sealing pass did."""

    busy: bool = False
    """Another sealer held the lock; nothing was tried."""
    sealed: int = 0
    waiting: bool = False
    """Stopped at a missing seq still inside the grace period."""
    more: bool = False
    """The batch was full: more rows may be waiting."""


async def seal_pending(db: Database, grace_s: float = GRACE_S, batch: int = BATCH) -> Pass:
    """One pass: seal up to ``batch`` committed rows, if no other sealer is running."""
    async with db.transaction() as conn:
        if not await store.try_lock_sealer(conn):
            return Pass(busy=True)
        rows = await store.unsealed(conn, batch)
        if not rows:
            return Pass()
        now = await store.database_now(conn)
        head = await store.head(conn) or ChainHead(0, chain.GENESIS, 0)
        plan = chain.plan(head, rows, now, timedelta(seconds=grace_s))
        if plan.seals:
            await store.seal(conn, plan.seals)
            await store.record_gaps(conn, plan.gaps)
            await store.save_head(conn, plan.head)
    for gap in plan.gaps:
        log.warning(
            "audit seqs %d..%d never committed within %.0f s; sealed past them",
            gap.first_seq,
            gap.last_seq,
            grace_s,
        )
    return Pass(
        sealed=len(plan.seals), waiting=plan.waiting, more=len(rows) == batch and not plan.waiting
    )


async def seal_all(db: Database, grace_s: float = GRACE_S) -> int:
    """Seal everything sealable now, waiting for another sealer if needed; rows sealed."""
    sealed = 0
    while True:
        result = await seal_pending(db, grace_s)
        sealed += result.sealed
        if result.busy:
            await asyncio.sleep(BUSY_RETRY_S)
        elif not result.more:
            return sealed


class Sealer:
    """This instance's background sealer: a pass after every wake-up and every tick."""

    def __init__(self, db: Database, grace_s: float = GRACE_S, tick_s: float = TICK_S) -> None:
        self._db = db
        self._grace_s = grace_s
        self._tick_s = tick_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tick_s):
                    await self._wake.wait()
            await asyncio.sleep(COALESCE_S)
            self._wake.clear()
            try:
                await self._drain()
            except Unavailable:
                log.warning("audit sealing postponed: database unavailable")
            except Exception:
                log.exception("audit sealing pass failed; retrying on the next tick")

    async def _drain(self) -> None:
        busy = 0
        while True:
            result = await seal_pending(self._db, self._grace_s)
            if result.busy and busy < BUSY_RETRIES:
                busy += 1
                await asyncio.sleep(BUSY_RETRY_S)
            elif not result.more:
                return


def start(app: FastAPI, db: Database) -> asyncio.Task[None]:
    """Start the sealer for the lifespan; ``WakeSealer`` finds it on ``app.state``."""
    sealer = Sealer(db)
    app.state.audit_sealer = sealer
    return asyncio.create_task(sealer.run())


class WakeSealer:
    """ASGI middleware: once a request that may have written audit rows has been answered,
    wake this instance's sealer. Reads (GET, HEAD, OPTIONS) write none."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
                sealer = getattr(getattr(scope.get("app"), "state", None), "audit_sealer", None)
                if isinstance(sealer, Sealer):
                    sealer.wake()
