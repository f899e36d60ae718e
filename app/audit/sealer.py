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
- **Promptly, off the request path.** A pass runs every ``EVERY_S``, so a row is sealed
  within about that long after it commits, whichever instance wrote it; an idle pass is one
  short transaction that finds nothing. ``toolgate serve`` runs the passes in a process of
  their own (``spawn``: ``python -m app.audit.sealer``), so hashing and sealing never take
  CPU from its workers' requests, and one sealer per instance tries the lock, not one per
  worker. An app run any other way (tests, embedding) seals in a task of its lifespan
  (``start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.config
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta

from app.audit import chain, store
from app.audit.models import ChainHead
from app.db import Database
from app.errors import Unavailable

GRACE_S = 5.0
EVERY_S = 0.2
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
    """Sealing passes every ``EVERY_S``, each run until nothing sealable is left."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def run(self) -> None:
        while True:
            try:
                await self._drain()
            except Unavailable:
                log.warning("audit sealing postponed: database unavailable")
            except Exception:
                log.exception("audit sealing pass failed; retrying on the next tick")
            await asyncio.sleep(EVERY_S)

    async def _drain(self) -> None:
        busy = 0
        while True:
            result = await seal_pending(self._db)
            if result.busy and busy < BUSY_RETRIES:
                busy += 1
                await asyncio.sleep(BUSY_RETRY_S)
            elif not result.more:
                return


def start(db: Database) -> asyncio.Task[None]:
    """Seal in a task of the running loop (an app not run by ``toolgate serve``)."""
    return asyncio.create_task(Sealer(db).run())


def spawn() -> subprocess.Popen[bytes]:
    """Start this instance's sealer process, configured by the same ``TOOLGATE_*``
    environment, logging to the same stderr. It stops on SIGTERM or SIGINT, or by itself
    within ``EVERY_S`` once this process is gone (even killed, when no cleanup runs)."""
    command = [sys.executable, "-m", __name__, str(os.getpid())]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def main(parent: int) -> None:
    import uvloop

    from app.logs import log_config
    from app.settings import Settings

    logging.config.dictConfig(log_config())
    try:
        uvloop.run(_seal_while_alive(Settings.from_env().check_database(), parent))
    finally:
        logging.shutdown()


async def _seal_while_alive(database_url: str, parent: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def running() -> bool:
        return not stop.is_set() and os.getppid() == parent

    db = Database(database_url)
    while running():
        try:
            await db.open(min_size=1, max_size=1)
            break
        except Unavailable as exc:
            log.warning("audit sealer waiting for the database: %s", exc.detail)
            await asyncio.sleep(1.0)
    else:
        return
    sealer = start(db)
    try:
        while running():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), EVERY_S)
    finally:
        sealer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sealer
        await db.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
