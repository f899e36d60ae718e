"""Sealing committed audit rows into the hash chain, off the request path.

Why not hash on insert: chaining a row to "the previous row" inside the request's own
transaction would make every audit write wait for the last one to commit, a global lock on
every decision across every instance. Instead request transactions only INSERT
(``store.append``; ``seq`` comes from a bigserial) and commit as they always did, and a
sealer inserts ``chain_pos``/``prev_hash``/``hash`` for committed rows right after, into
``audit_seals``: audit rows themselves are never updated, so sealing rewrites none of their
index entries and leaves no dead versions behind.

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
- **Only from a head it can vouch for, signing the new one.** Before extending the chain a
  pass checks the stored head against its signed checkpoint (``checkpoints.refusal``): a
  head moved without the key is not extended, and the refusal is logged. The new head is
  written as a checkpoint, signed when ``TOOLGATE_AUDIT_SIGNING_KEY`` is set, in the same
  transaction, and the newest one is published after commit, at most every
  ``PUBLISH_EVERY_S``, as a log line and to ``TOOLGATE_AUDIT_CHECKPOINT_FILE``.
- **No row stalls it.** A row's published form is total (``chain.item``): a stored value
  nothing can publish is hashed as a digest stand-in, logged as an error, and the chain
  moves on.
- **At a cost that does not grow with history.** A pass reads the rows above the head's
  ``sealed_through`` through the primary key and late rows through the recorded gaps
  (``store.unsealed``), never an index of rows that were once unsealed; the seals of a
  chunk are one ``INSERT``, and each chunk is hashed while the database writes the one
  before. Gaps
  recorded in the last ``LATE_WINDOW_S`` are looked in on every pass, all of them every
  ``SWEEP_EVERY_S``.
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
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.audit import chain, checkpoints, store
from app.audit.checkpoints import SigningKey
from app.audit.models import AuditRow, ChainHead, Checkpoint
from app.db import Connection, Database, Lock, try_xact_lock
from app.errors import Unavailable
from app.settings import ConfigError, Settings

GRACE_S = 5.0
EVERY_S = 0.2
BATCH = 2000
CHUNK = 500
BUSY_RETRY_S = 0.05
BUSY_RETRIES = 40
PUBLISH_EVERY_S = 1.0
LATE_WINDOW_S = 3600.0
"""Every pass looks for late rows in the gaps recorded this recently..."""
SWEEP_EVERY_S = 60.0
"""...and every this often in all of them."""
REFUSAL_LOG_EVERY_S = 60.0
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
    checkpoint: Checkpoint | None = None
    """The head this pass wrote."""
    refused: str | None = None
    """Why the chain head must not be extended (``checkpoints.refusal``); nothing was sealed."""


async def seal_pending(
    db: Database,
    grace_s: float = GRACE_S,
    batch: int = BATCH,
    *,
    key: SigningKey | None = None,
    gaps_since: datetime = store.EVERY_GAP,
) -> Pass:
    """One pass: seal up to ``batch`` committed rows, if no other sealer is running, and
    write the new head as a checkpoint (signed with ``key``). Late rows are looked for in
    the gaps recorded after ``gaps_since``."""
    async with db.transaction() as conn:
        if not await try_xact_lock(conn, Lock.SEALER):
            return Pass(busy=True)
        rows = await store.unsealed(conn, batch, gaps_since)
        if not rows:
            return Pass()
        current = await store.head(conn)
        refused = checkpoints.refusal(current, key)
        if refused is not None:
            return Pass(refused=refused)
        now = await store.database_now(conn)
        head = current.head if current else ChainHead(0, chain.GENESIS, 0)
        plan = await _hash_and_seal(conn, head, rows, now, timedelta(seconds=grace_s))
        checkpoint = None
        if plan.seals:
            checkpoint = checkpoints.checkpoint(plan.head, chain.rfc3339(now), key)
            await store.record_gaps(conn, plan.gaps)
            await store.save_head(conn, checkpoint)
    for gap in plan.gaps:
        log.warning(
            "audit seqs %d..%d never committed within %.0f s; sealed past them",
            gap.first_seq,
            gap.last_seq,
            grace_s,
        )
    for seq, fields in plan.stood_in.items():
        log.error(
            "audit seq %d sealed with a stand-in (digest) for %s: the stored JSON is beyond "
            "what can be published (numbers beyond range are kept as text; see the row)",
            seq,
            ", ".join(fields),
        )
    if checkpoint and current and key and current.signature is None:
        log.warning(
            "audit chain head at position %d had no signature; signed as found from now on "
            "(expected once after enabling TOOLGATE_AUDIT_SIGNING_KEY; otherwise compare "
            "with the published checkpoints: toolgate audit verify --checkpoints)",
            current.chain_pos,
        )
    return Pass(
        sealed=len(plan.seals),
        waiting=plan.waiting,
        more=len(rows) == batch and not plan.waiting,
        checkpoint=checkpoint,
    )


async def _hash_and_seal(
    conn: Connection, head: ChainHead, rows: list[AuditRow], now: datetime, grace: timedelta
) -> chain.Plan:
    """Plan the chain over ``rows`` and write it, ``CHUNK`` rows at a time: each chunk is
    hashed here while the database writes the one before, so a backlog drains at the pace
    of the slower of the two rather than of both in turn."""
    plan = chain.Plan(head=head)
    writing: asyncio.Task[None] | None = None
    try:
        for start in range(0, len(rows), CHUNK):
            done = len(plan.seals)
            chain.extend(plan, rows[start : start + CHUNK], now, grace)
            if writing is not None:
                await writing
                writing = None
            if len(plan.seals) > done:
                writing = asyncio.create_task(store.seal(conn, plan.seals[done:]))
                await asyncio.sleep(0)  # the statement is on its way before the next hashing
        if writing is not None:
            await writing
    finally:
        if writing is not None and not writing.done():
            with contextlib.suppress(Exception):
                await writing
    return plan


async def seal_all(
    db: Database,
    grace_s: float = GRACE_S,
    *,
    key: SigningKey | None = None,
    report: Callable[[int], None] = lambda sealed: None,
) -> int:
    """Seal everything sealable now, waiting for another sealer if needed; rows sealed
    (``report`` is told the count after each pass)."""
    sealed = 0
    while True:
        result = await seal_pending(db, grace_s, key=key)
        sealed += result.sealed
        report(sealed)
        if result.busy:
            await asyncio.sleep(BUSY_RETRY_S)
        elif not result.more:
            return sealed


class Sealer:
    """Sealing passes every ``EVERY_S``, each run until nothing sealable is left; the newest
    checkpoint published at most every ``PUBLISH_EVERY_S`` (and when it stops)."""

    def __init__(self, db: Database, key: SigningKey | None, checkpoint_file: Path | None) -> None:
        self._db = db
        self._key = key
        self._checkpoint_file = checkpoint_file
        self._newest: Checkpoint | None = None
        self._published_at = -math.inf
        self._refusal_logged_at = -math.inf
        self._swept_at = -math.inf

    async def run(self) -> None:
        if self._key is None:
            log.warning(
                "audit checkpoints are unsigned: anyone who can write the database can rewrite "
                "the audit chain unnoticed; set TOOLGATE_AUDIT_SIGNING_KEY "
                "(toolgate audit keygen)"
            )
        try:
            while True:
                try:
                    await self._drain()
                except Unavailable:
                    log.warning("audit sealing postponed: database unavailable")
                except Exception:
                    log.exception("audit sealing pass failed; retrying on the next tick")
                self._publish(PUBLISH_EVERY_S)
                await asyncio.sleep(EVERY_S)
        finally:
            self._publish(0.0)

    async def _drain(self) -> None:
        busy, now = 0, time.monotonic()
        gaps_since = store.EVERY_GAP
        if now - self._swept_at < SWEEP_EVERY_S:
            gaps_since = datetime.now(UTC) - timedelta(seconds=LATE_WINDOW_S)
        else:
            self._swept_at = now
        while True:
            result = await seal_pending(self._db, key=self._key, gaps_since=gaps_since)
            self._newest = result.checkpoint or self._newest
            if result.refused is not None:
                self._refuse(result.refused)
                return
            if result.busy and busy < BUSY_RETRIES:
                busy += 1
                await asyncio.sleep(BUSY_RETRY_S)
            elif not result.more:
                return

    def _refuse(self, reason: str) -> None:
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_EVERY_S:
            self._refusal_logged_at = now
            log.error("audit sealing refused: %s; rows stay unsealed", reason)

    def _publish(self, every_s: float) -> None:
        """Publish the newest checkpoint outside the database: a log line and, when
        configured, a line appended to the checkpoint file."""
        checkpoint, now = self._newest, time.monotonic()
        if checkpoint is None or now - self._published_at < every_s:
            return
        self._newest, self._published_at = None, now
        log.info("audit checkpoint", extra={"fields": checkpoint.as_dict()})
        if self._checkpoint_file is not None:
            try:
                with self._checkpoint_file.open("ab") as out:
                    out.write(checkpoints.record(checkpoint))
            except OSError as exc:
                log.error("audit checkpoint not written to %s: %s", self._checkpoint_file, exc)


def start(db: Database, settings: Settings) -> asyncio.Task[None]:
    """Seal in a task of the running loop (an app not run by ``toolgate serve``)."""
    sealer = Sealer(db, checkpoints.signing_key(settings), settings.audit_checkpoint_file)
    return asyncio.create_task(sealer.run())


def spawn() -> subprocess.Popen[bytes]:
    """Start this instance's sealer process, configured by the same ``TOOLGATE_*``
    environment, logging to the same stderr. It stops on SIGTERM or SIGINT, or by itself
    within ``EVERY_S`` once this process is gone (even killed, when no cleanup runs)."""
    command = [sys.executable, "-m", __name__, str(os.getpid())]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def main(parent: int) -> None:
    import uvloop

    from app.logs import log_config

    logging.config.dictConfig(log_config())
    try:
        uvloop.run(_seal_while_alive(Settings.from_env(), parent))
    except ConfigError as exc:
        log.error("audit sealer not started: %s", exc)
    finally:
        logging.shutdown()


async def _seal_while_alive(settings: Settings, parent: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def running() -> bool:
        return not stop.is_set() and os.getppid() == parent

    db = Database(settings.check_database())
    while running():
        try:
            await db.open(min_size=1, max_size=1)
            break
        except Unavailable as exc:
            log.warning("audit sealer waiting for the database: %s", exc.detail)
            await asyncio.sleep(1.0)
    else:
        return
    try:
        sealer = start(db, settings)
    except ConfigError:
        await db.close()
        raise
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
