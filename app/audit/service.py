"""Reading the audit trail: who may read what, pages, the NDJSON export, verification.

Auditors read their own tenant's rows; admins read every tenant's; anyone else is refused.
Verification recomputes the one chain all tenants share, so it is the same report for both:
it names a broken row by seq and reason only, never by its contents.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import orjson

from app import cursors, load
from app.audit import archive, chain, checkpoints, sealer, store
from app.audit.checkpoints import Exported, PublicKey, SigningKey
from app.audit.models import Anchor, AuditFilter, AuditPage, Unchained, VerifyReport
from app.auth.principal import Principal
from app.db import Connection, Database, Lock
from app.errors import Forbidden, InvalidRequest
from app.progress import Report, quiet
from app.settings import Settings

EXPORT_PAGE = 100
VERIFY_PAGE = 200
VERIFY_SLICE = 50
HEAVY_PAUSE_S = 0.002
REST_RATIO = 20.0


class Turns:
    """Exports and verifications run on the workers that answer decisions, so they work in
    small steps (a page of ``EXPORT_PAGE`` or ``VERIFY_PAGE`` rows read, ``VERIFY_SLICE``
    hashed), one step at a time in a process, and one verification at a time. While the
    worker is serving decisions (``app.load.busy``), the next step of any of them waits
    until ``REST_RATIO`` times as long as the last step took has passed (at least
    ``HEAVY_PAUSE_S``): a decision waiting behind one waits for a step, not for thousands of
    rows, and together they take about a twentieth of the worker however many run
    (``bench/README.md`` has what that does to a saturated worker's read latency). On an
    idle worker, and with ``resting=False`` (the command line, which serves nobody else), a
    step only yields first. A turn is held for a step only, never while a client is slow to
    read."""

    def __init__(self, *, resting: bool = True) -> None:
        self._resting = resting
        self._next = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._verifying = asyncio.Semaphore(1)

    def _bind(self) -> None:
        """Locks serve one event loop: new ones for another (a test's, say)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._lock, self._verifying = loop, asyncio.Lock(), asyncio.Semaphore(1)

    @asynccontextmanager
    async def step(self) -> AsyncIterator[None]:
        self._bind()
        async with self._lock:
            wait = self._next - time.perf_counter() if self._resting and load.busy() else 0.0
            await asyncio.sleep(max(wait, 0.0))
            started = time.perf_counter()
            try:
                yield
            finally:
                ended = time.perf_counter()
                self._next = ended + max(HEAVY_PAUSE_S, REST_RATIO * (ended - started))

    @asynccontextmanager
    async def verification(self) -> AsyncIterator[None]:
        """One verification at a time: each holds a connection, and postpones retention's
        cuts (``Lock.CHAIN``), for as long as it runs."""
        self._bind()
        async with self._verifying:
            yield


TURNS = Turns()
"""This process's heavy reads' turns."""


STALL_S = 60.0
"""A row unsealed this long after its insert is stalled: the sealer, every 0.2 s, passes a
missing seq after 5 s, so only a pass that keeps failing or refusing leaves one this old."""


def readable(settings: Settings, principal: Principal, where: AuditFilter) -> AuditFilter:
    """``where`` confined to the tenants this principal may read, or ``Forbidden``."""
    if settings.admin_role in principal.roles:
        return where
    if settings.auditor_role not in principal.roles:
        raise Forbidden("reading the audit trail needs the auditor or admin role")
    if where.tenant is not None and where.tenant != principal.tenant:
        raise Forbidden("auditors read their own tenant's audit trail only")
    return replace(where, tenant=principal.tenant)


def _after(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    [seq] = cursors.decode(cursor, 1)
    if not seq.isdigit():
        raise InvalidRequest("malformed cursor")
    return int(seq)


async def page(
    db: Database,
    settings: Settings,
    principal: Principal,
    where: AuditFilter,
    limit: int,
    cursor: str | None,
) -> AuditPage:
    """One page, oldest first; ``next_cursor`` is null on the last page."""
    where = readable(settings, principal, where)
    async with db.connection() as conn:
        rows, more = await store.page(conn, where, _after(cursor), limit)
    return {
        "items": [chain.item(row) for row in rows],
        "next_cursor": cursors.encode(rows[-1].seq) if more else None,
    }


async def export(
    db: Database, settings: Settings, principal: Principal, where: AuditFilter, cursor: str | None
) -> AsyncIterator[bytes]:
    """Every matching row as NDJSON, fetched in keyset pages while the client reads.

    Access, the cursor and the first page are settled before the response starts, so a
    refusal or an unreachable database is still a problem response. No connection is held
    between pages and no turn (``Turns``) while the client reads, so a slow reader costs
    none.
    """
    where = readable(settings, principal, where)
    async with db.connection() as conn:
        first = await store.page(conn, where, _after(cursor), EXPORT_PAGE)
    return _lines(db, where, first)


async def _lines(db: Database, where: AuditFilter, page: store.Page) -> AsyncIterator[bytes]:
    while True:
        async with TURNS.step():
            lines = b"".join(orjson.dumps(chain.item(row)) + b"\n" for row in page.rows)
        yield lines
        if not page.more:
            return
        async with TURNS.step(), db.connection() as conn:
            page = await store.page(conn, where, page.rows[-1].seq, EXPORT_PAGE)


async def verify_for(db: Database, settings: Settings, principal: Principal) -> VerifyReport:
    """The chain verified for an auditor or admin, once this process's other verification
    is done (``Turns.verification``)."""
    readable(settings, principal, AuditFilter())
    key = checkpoints.signing_key(settings)
    days = settings.audit_retention_days
    async with TURNS.verification():
        return await verify(
            db,
            key.public if key else None,
            turns=TURNS,
            horizon=timedelta(days=days) if days else None,
        )


async def verify(
    db: Database,
    public: PublicKey | None = None,
    exported: Sequence[Exported] = (),
    turns: Turns | None = None,
    archive_dir: Path | None = None,
    horizon: timedelta | None = None,
    report: Report = quiet,
) -> VerifyReport:
    """Recompute the chain in sealing order, up to the head of one short snapshot, and name
    the first thing that does not hold: a broken row, a chain cut short, a head not signed
    by ``public``'s key, sealed and skipped seqs that do not add up, or a published
    checkpoint (``exported``) the chain no longer matches. Rows left unsealed for
    ``STALL_S`` make it not ok too: sealing has stopped. So does a row the chain passed by
    without sealing it (``store.unchained``: a second row under a sealed seq, say), which
    no seal, gap or unsealed count otherwise accounts for. With ``archive_dir``, the archive
    files of removed months are recomputed too (``archive.check``), up to the anchor, and
    published checkpoints of archived positions are compared with them instead of being
    passed over. With the audit retention (``horizon``), a checkpoint of a removed position
    that is newer than the retention allows is a break (``checkpoints.removed_early``).
    ``report`` is told how far the walks have come (the command line's progress)."""
    turns = turns or Turns(resting=False)
    async with db.sharing(Lock.CHAIN) as conn:
        async with turns.step(), store.snapshot(conn):
            unsealed = await store.unsealed_count(conn)
            stalled = await store.unsealed_count(conn, STALL_S)
            current = await store.head(conn)
            head = current.head if current else None
            anchor = await store.anchor(conn)
            skipped = await store.skipped_count(conn)
            end, through = (head.chain_pos, head.sealed_through) if head else (0, 0)
            gaps = await store.gap_seqs(conn, through)
            beyond, accounted = await store.sealed_outside_gaps(
                conn, through, anchor.chain_pos, end, inside=False
            )
            archives = await store.archives(conn) if archive_dir is not None else []
        walk, surplus, counted = await _walk(conn, turns, anchor, end, through, report)
        unchained = await _unchained(conn, turns, through, report) if walk.broken is None else None
        # Sealed and skipped seqs add up when no seal lies outside the chain, no position
        # holds two, and every seq up to ``sealed_through`` is sealed, skipped, or removed
        # by retention.
        beyond += surplus
        uncovered = through - accounted - counted - gaps - anchor.outside_gaps
        # Checkpoints of removed positions can be compared only with an archive of them.
        start = archives[0].first_pos if archives else anchor.chain_pos
        comparable = [(line, c) for line, c in exported if c.chain_pos >= start]
        positions = sorted({published.chain_pos for _, published in comparable})
        hashes = await store.hashes_at(conn, positions) if positions else {}
        if anchor.chain_pos:
            hashes[anchor.chain_pos] = anchor.hash
    archived = archive.Checked()
    if archive_dir is not None:
        archived = archive.check(archive_dir, archives, anchor, set(positions), report)
        hashes.update(archived.hashes)
    broken = (
        walk.broken
        or archived.broken
        or chain.check_end(walk, head)
        or checkpoints.head_problem(current, public)
        or chain.check_accounts(head, beyond, uncovered)
        or chain.check_unchained(head, unchained)
        or checkpoints.compare(comparable, head, hashes, public)
        or checkpoints.anchor_problem(anchor, public)
        or checkpoints.removed_early(exported, anchor, public, horizon)
    )
    return VerifyReport(
        ok=broken is None and stalled == 0,
        checked=walk.checked,
        sealed_through=head.sealed_through if head else 0,
        unsealed=unsealed,
        skipped=skipped,
        first_broken=broken,
        stalled=stalled,
        signed=bool(public and current and public.vouches_for(current)),
        key_id=current.key_id if current else None,
        exported=len(comparable),
        removed_through=anchor.chain_pos,
        removed_before=anchor.at,
        anchor_signed=bool(public and anchor.chain_pos and public.vouches_for_anchor(anchor)),
        archived=archived.rows,
        archive_files=len(archives),
    )


async def _walk(
    conn: Connection, turns: Turns, anchor: Anchor, end: int, through: int, report: Report
) -> tuple[chain.Walk, int, int]:
    """The chain walked from ``anchor`` up to position ``end`` (the first break ends it);
    the seals in the positions it covered beyond one per position (a second seal at a
    position, or one whose audit row is gone, which the page leaves out); and how many of
    those seals hold a seq up to ``through`` outside every recorded gap. Rows up to the
    head never change and, under ``Lock.CHAIN``, are never removed, so each page is a
    statement of its own instead of a snapshot held for the whole walk."""
    walk, surplus, counted = chain.Walk(anchor.chain_pos, anchor.hash), 0, 0
    while walk.broken is None and walk.chain_pos < end:
        async with turns.step():
            rows = await store.chain_page(conn, walk.chain_pos, end, VERIFY_PAGE)
            if rows:
                last = rows[-1].chain_pos or end
                seals, outside_gaps = await store.sealed_outside_gaps(
                    conn, through, walk.chain_pos, last, inside=True
                )
                surplus += seals - (last - walk.chain_pos)
                counted += outside_gaps
        if not rows:
            break
        for start in range(0, len(rows), VERIFY_SLICE):
            async with turns.step():
                walk = chain.check(walk, rows[start : start + VERIFY_SLICE], end)
            if walk.broken is not None:
                break
        report("verifying the chain", walk.chain_pos - anchor.chain_pos, end - anchor.chain_pos)
    return walk, surplus, counted


async def _unchained(conn: Connection, turns: Turns, through: int, report: Report) -> Unchained:
    """Every row up to seq ``through`` read a page per statement, in seq order: how many of
    them the chain does not hold though it passed their seq, and the first one. Rows up to
    ``through`` never change except by such an insert, so, like ``_walk``, this needs no
    snapshot, and it keeps only two counts."""
    count, first, after = 0, None, None
    while True:
        async with turns.step():
            page = await store.unchained(conn, after, through, VERIFY_PAGE)
        count += page.count
        first = page.first if first is None else first
        if page.last is None:
            return Unchained(after, count, first)
        after = page.last
        report("checking every row is chained (by seq)", after[0], through)


async def seal_and_verify(
    url: str,
    key: SigningKey | None,
    public: PublicKey | None,
    exported: Sequence[Exported],
    archive_dir: Path | None = None,
    horizon: timedelta | None = None,
    report: Report = quiet,
) -> VerifyReport:
    """For ``toolgate audit verify``: seal what can be sealed now (with ``key``), then
    verify against ``public``, the published checkpoints, the archive files and the audit
    retention (``horizon``). ``report`` is told how far each step has come."""
    db = Database(url)
    await db.open(min_size=1, max_size=2)
    try:
        async with db.connection() as conn:
            unsealed = await store.unsealed_count(conn)
        await sealer.seal_all(db, key=key, report=lambda done: report("sealing", done, unsealed))
        return await verify(
            db, public, exported, archive_dir=archive_dir, horizon=horizon, report=report
        )
    finally:
        await db.close()
