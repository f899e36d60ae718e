"""The audit trail by month: partitions made ahead, old months removed whole, and the
archive files that keep them verifiable.

Why months: removing old audit rows one by one rewrote indexes and left dead rows for
VACUUM in proportion to the history removed. ``audit_events`` and ``audit_seals`` are
partitioned by the calendar month (UTC) of ``at`` (migration 0016), so retention drops a
month's two partitions instead.

- **Partitions ahead.** ``maintain`` makes the current month's and the next ``AHEAD``
  months' partitions, on start-up and in every purger pass (under its lock). A row whose
  month has no partition lands in the DEFAULT partition: it is logged as an error, and that
  partition is never dropped as a month (its rows leave only with a later month's cut).
- **The chain stays a prefix cut.** A month goes only when its whole range is older than
  the cutoff and every row of it is sealed. The anchor moves to the highest chain position
  among its rows; rows of other months sealed at or below it (near the month's boundary,
  late rows) are deleted in the same transaction, which then drops the partitions. Verify
  walks from the anchor as before.
- **Archived first, when configured** (``TOOLGATE_AUDIT_ARCHIVE_DIR``). The stretch of the
  chain the cut removes, from the old anchor to the new one, is checked (every link and
  hash recomputed) and written to a file there, one JSON line per row in exactly the item
  format of ``GET /audit/export`` (written to a temporary name, fsynced, renamed). Its
  ``audit_archives`` row (positions, the hash before the first row and the last one's, row
  count, SHA-256) is inserted in the transaction that drops the month. A write that fails,
  or a chain that does not hold, removes nothing; the next pass tries again.
  ``toolgate audit verify --archive DIR`` checks the files (``check``).
- **Short locks.** The month's partitions are locked, then dropped, which needs the parent
  tables for a moment: both wait at most ``LOCK_TIMEOUT``, so a long statement holding them
  postpones the removal to the next pass instead of queueing every insert behind it.
- **Never under a verification.** A verification reads the chain page by page, each in a
  statement of its own, holding ``Lock.CHAIN`` shared; a cut takes it exclusively or waits
  for the next pass, so no page a verification has yet to read goes under it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

import orjson
import rfc8785

from app.audit import chain, store
from app.audit.checkpoints import SigningKey
from app.audit.models import Anchor, Archived, Broken
from app.db import Connection, Database, DatabaseError, Lock, LockNotAvailable, try_xact_lock
from app.durable import sync_directory
from app.progress import Report, quiet

AHEAD = 2
LOCK_TIMEOUT = "2s"
PAGE = 1000
log = logging.getLogger("toolgate.audit")


def bounds(month: date) -> tuple[datetime, datetime]:
    """``[first, end)`` of a month, UTC."""
    first = datetime(month.year, month.month, 1, tzinfo=UTC)
    return first, _next(first)


def _next(at: datetime) -> datetime:
    return (at.replace(day=1) + timedelta(days=32)).replace(day=1)


async def maintain(conn: Connection, now: datetime) -> None:
    """Make the partitions of ``now``'s month and the next ``AHEAD``; log rows that found no
    month partition."""
    month = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for _ in range(AHEAD + 1):
        try:
            async with conn.transaction():
                if await store.create_partitions(conn, month.date()):
                    log.info("audit partitions for %s made", f"{month:%Y-%m}")
        except DatabaseError as exc:
            log.error("audit partitions for %s not made: %s", f"{month:%Y-%m}", exc)
        month = _next(month)
    stray = await store.outside_months(conn)
    if stray:
        log.error(
            "%d audit rows are in the default partition: no month partition was there for "
            "their time. They stay until a later month is removed; make partitions ahead "
            "(the purger's pass does) so that none land there",
            stray,
        )


async def remove_months(
    db: Database,
    before: datetime,
    directory: Path | None,
    *,
    retention_days: int,
    key: SigningKey | None,
) -> int:
    """Remove, oldest first, every month wholly before ``before`` (at least
    ``retention_days`` ago, the audit retention the cut is made under) that can go now;
    chain positions removed. The new start of the chain records that retention and is
    signed with ``key`` when there is one, so verify can tell it from a start moved by
    anyone else. A month that cannot go (rows unsealed, archive not written, locks not
    granted in time) stops the pass: later months wait behind it."""
    if before > datetime.now(UTC) - timedelta(days=retention_days):
        raise ValueError("months are removed only when older than the audit retention")
    removed = 0
    async with db.connection() as conn:
        months = await store.months(conn)
    for month in months:
        if bounds(month)[1] > before:
            break
        done = await _remove(db, month, directory, retention_days, key)
        if done is None:
            break
        removed += done
    return removed


async def _remove(
    db: Database,
    month: date,
    directory: Path | None,
    retention_days: int,
    key: SigningKey | None,
) -> int | None:
    first, end = bounds(month)
    async with db.connection() as conn:
        if await store.unsealed_between(conn, first, end):
            log.warning(
                "audit month %s kept: some of its rows are not sealed yet", f"{month:%Y-%m}"
            )
            return None
        anchor = await store.anchor(conn)
        last = await store.last_pos_between(conn, first, end) or anchor.chain_pos
        archived = None
        if directory is not None and last > anchor.chain_pos:
            archived = await _write(conn, directory, month, anchor, last)
            if archived is None:
                return None
    try:
        async with db.transaction() as conn:
            if not await try_xact_lock(conn, Lock.CHAIN):
                log.warning(
                    "audit month %s kept for now: the chain is being verified", f"{month:%Y-%m}"
                )
                return None
            await store.lock_month(conn, month, LOCK_TIMEOUT)
            if (
                await store.unsealed_between(conn, first, end)
                or await store.anchor(conn) != anchor
                or (await store.last_pos_between(conn, first, end) or anchor.chain_pos) != last
            ):
                log.warning("audit month %s kept: it changed while archived", f"{month:%Y-%m}")
                return None
            if archived is not None:
                await store.record_archive(conn, archived)
            moved = anchor
            if last > anchor.chain_pos:  # else the month holds no chained row: nothing cut
                moved = await store.next_anchor(conn, anchor, last, retention_days)
                if key is not None:
                    moved = key.sign_anchor(moved)
            removed = await store.remove_month(conn, month, first, end, anchor, moved)
    except LockNotAvailable:
        log.warning("audit month %s kept for now: its tables were busy", f"{month:%Y-%m}")
        return None
    log.info(
        "audit month %s removed (chain positions up to %d)%s",
        f"{month:%Y-%m}",
        last,
        f", archived to {archived.file}" if archived else "; no archive configured",
    )
    return removed


async def _write(
    conn: Connection, directory: Path, month: date, anchor: Anchor, last: int
) -> Archived | None:
    """Check and write positions ``anchor.chain_pos + 1 .. last`` to a file in
    ``directory``; None (logged) when the chain does not hold or the file cannot be written."""
    name = f"audit-{month:%Y-%m}-{anchor.chain_pos + 1:012d}-{last:012d}.ndjson"
    temporary = directory / f".{name}.partial"
    digest, walk = hashlib.sha256(), chain.Walk(anchor.chain_pos, anchor.hash)
    try:
        with _created(temporary) as out:
            while walk.chain_pos < last:
                rows = await store.chain_page(conn, walk.chain_pos, last, PAGE)
                walk = chain.check(walk, rows, last)
                if walk.broken is not None or not rows:
                    broken = walk.broken or Broken(None, walk.chain_pos + 1, "rows missing")
                    log.error(
                        "audit month %s not archived: the chain breaks at position %d (%s); "
                        "run toolgate audit verify",
                        f"{month:%Y-%m}",
                        broken.chain_pos,
                        broken.reason,
                    )
                    temporary.unlink(missing_ok=True)
                    return None
                lines = b"".join(orjson.dumps(chain.item(r)) + b"\n" for r in rows)
                digest.update(lines)
                out.write(lines)
            out.flush()
            os.fsync(out.fileno())
        temporary.rename(directory / name)
        sync_directory(directory)
    except OSError as exc:
        log.error("audit month %s not archived to %s: %s", f"{month:%Y-%m}", directory, exc)
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        return None
    count = last - anchor.chain_pos
    return Archived(
        name, month, anchor.chain_pos + 1, last, anchor.hash, walk.hash, count, digest.hexdigest()
    )


def _created(path: Path) -> BinaryIO:
    """``path`` made afresh, readable and writable by this user only: an archive holds every
    tenant's rows. Whatever is there first (a crashed pass's leftover, or a link planted by
    anyone who can write the directory to have a key or a database file overwritten) is
    removed, not written through: ``O_EXCL`` creates the file itself or fails."""
    path.unlink(missing_ok=True)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


@dataclass
class Checked:
    """What ``check`` found: rows recomputed, hashes at the positions asked for, the first
    problem."""

    rows: int = 0
    hashes: dict[int, str] = field(default_factory=dict)
    broken: Broken | None = None


def check(
    directory: Path,
    archives: list[Archived],
    anchor: Anchor,
    wanted: set[int],
    report: Report = quiet,
) -> Checked:
    """Recompute every archived file's chain: each file as recorded (SHA-256, row count,
    first and last hash), each one following the one before, and the last one ending where
    the database's chain starts (the anchor). ``wanted``: positions whose hashes to return
    (published checkpoints). ``report`` is told the rows checked after each file."""
    checked = Checked()
    previous: Archived | None = None
    total = sum(a.rows for a in archives)
    for archived in archives:
        report("checking the archive", checked.rows, total)
        problem = _follows(previous, archived)
        if problem is None:
            problem = _check_file(directory, archived, wanted, checked)
        if problem is not None:
            checked.broken = Broken(None, archived.first_pos, problem)
            return checked
        previous = archived
    if previous is not None and (previous.last_pos, previous.last_hash) != (
        anchor.chain_pos,
        anchor.hash,
    ):
        reason = (
            f"the archive ends at position {previous.last_pos} but the database's chain starts "
            f"after position {anchor.chain_pos} with another hash"
        )
        checked.broken = Broken(None, previous.last_pos, reason)
    return checked


def _follows(previous: Archived | None, archived: Archived) -> str | None:
    if previous is None or (archived.first_pos, archived.prev_hash) == (
        previous.last_pos + 1,
        previous.last_hash,
    ):
        return None
    return f"archive file {archived.file} does not follow {previous.file}"


def _check_file(
    directory: Path, archived: Archived, wanted: set[int], checked: Checked
) -> str | None:
    """Read a line at a time: a month's file can hold gigabytes, more than the machine that
    verifies it has memory for. Its SHA-256 is compared first, so an altered file is named
    as such whatever else is wrong in it."""
    name = f"archive file {archived.file}"
    path = directory / archived.file
    # The name comes from the database: only a plain name of a regular file, so that a
    # database writer cannot have another file vouched for, or verify wait on a FIFO or
    # read ``/dev/zero`` for ever.
    if Path(archived.file).name != archived.file or (path.exists() and not path.is_file()):
        return f"{name} is not a file of the archive directory"
    digest, lines = hashlib.sha256(), 0
    walk = chain.Walk(archived.first_pos - 1, archived.prev_hash)
    problem: str | None = None
    hashes: dict[int, str] = {}
    try:
        with path.open("rb") as content:
            for line in content:
                digest.update(line)
                lines += 1
                if problem is None:
                    walk, problem = _next_row(walk, line, archived.last_pos)
                    if problem is None and walk.chain_pos in wanted:
                        hashes[walk.chain_pos] = walk.hash
    except OSError as exc:
        return f"{name} cannot be read: {exc.strerror}"
    if digest.hexdigest() != archived.sha256:
        return f"{name} does not match its recorded SHA-256: altered"
    if problem is not None:
        return name + problem
    if (lines, walk.chain_pos, walk.hash) != (
        archived.rows,
        archived.last_pos,
        archived.last_hash,
    ):
        return f"{name} does not hold the rows recorded for it"
    checked.rows += walk.checked
    checked.hashes.update(hashes)
    return None


def _next_row(walk: chain.Walk, line: bytes, last_pos: int) -> tuple[chain.Walk, str | None]:
    """``walk`` moved on by one line of an archive file, or what is wrong with the line."""
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError:
        return walk, " holds a line that is not JSON"
    not_a_row = " holds a line that is not an audit row"
    if not (isinstance(document, dict) and isinstance(document.get("hash"), str)):
        return walk, not_a_row
    try:
        walk = chain.check_items(walk, [document], last_pos)
    except (rfc8785.CanonicalizationError, RecursionError):
        # What no published row holds (``chain.item`` keeps rows inside what JSON
        # canonicalization takes): a forged line, reported like any other.
        return walk, not_a_row
    if walk.broken is not None:
        return walk, f", position {walk.broken.chain_pos}: {walk.broken.reason}"
    return walk, None
