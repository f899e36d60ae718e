"""SQL for the audit trail. Writing: callers pass their open transaction, so a row commits
with the state change it describes or not at all. Reading and sealing: below."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import fields
from datetime import UTC, date, datetime
from typing import Any, NamedTuple, cast

from app.audit.chain import rfc3339
from app.audit.models import (
    Anchor,
    Archived,
    AuditFilter,
    AuditRow,
    CallEvent,
    Checkpoint,
    Gap,
    Seal,
    Unchained,
)
from app.db import Connection, Insert, Record, Writer, one_row, write_one
from app.evidence import Target


class AuditEvent(NamedTuple):
    event: str
    tenant: str
    actor: str
    call_id: str | None = None
    run_id: str | None = None
    tool: str | None = None
    target: Target | None = None
    fingerprint: str | None = None
    arguments: Any = None
    """Arguments with sensitive values already masked."""
    decision: str | None = None
    code: str | None = None
    reason: str | None = None
    policy_version: str | None = None
    approval_id: str | None = None
    proposed_by: str | None = None
    authorized_by: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    total_ms: float | None = None
    provider_ms: float | None = None


_INSERT = Insert.of("audit_events", AuditEvent._fields)
_COLUMNS = _INSERT.columns


async def append(conn: Connection, event: AuditEvent) -> None:
    await conn.execute(_INSERT.sql, *_INSERT.values(event))


_AFTER: dict[tuple[str, int], str] = {}


async def append_after(
    conn: Writer, changes: str, args: Sequence[Any], event: AuditEvent, order: str = ""
) -> bool:
    """Apply ``changes`` — data-modifying CTEs, the first named ``change`` and ``RETURNING``
    the rows it touched — and append ``event`` only if ``change`` touched a row, all in one
    statement: atomic even outside a transaction, and one round trip instead of four
    (``order``: of the rows ``changes`` lock, as ``write_one`` takes it). Whether ``change``
    touched a row."""
    key = (changes, len(args))
    sql = _AFTER.get(key)
    if sql is None:
        first = len(args) + 1
        params = ", ".join(f"${i}" for i in range(first, first + len(_COLUMNS)))
        sql = _AFTER[key] = (
            f"WITH {changes}, audit AS (INSERT INTO audit_events ({', '.join(_COLUMNS)}) "
            f"SELECT {params} WHERE EXISTS (SELECT 1 FROM change)) SELECT count(*) FROM change"
        )
    return bool(await write_one(conn, sql, *args, *_INSERT.values(event), order=order))


# Reading and sealing. A transaction that touches several audit tables reads
# ``audit_events`` first: TRUNCATE locks it before ``audit_seals``/``audit_chain``/
# ``audit_gaps``, so the same order on both sides cannot deadlock.
#
# Audit rows are never updated: the sealer inserts a row's chain columns into
# ``audit_seals`` (same ``seq`` and ``at``), and every read of them joins the two.

_CHAIN = ("chain_pos", "prev_hash", "hash", "sealed_at")
_EVENT = ", ".join(f.name for f in fields(AuditRow) if f.name not in _CHAIN)
"""The columns of ``audit_events``, in ``AuditRow``'s field order."""
_ROW = ", ".join(f"{'s' if f.name in _CHAIN else 'e'}.{f.name}" for f in fields(AuditRow))
"""Every column of ``AuditRow`` from a row ``e`` and its seal ``s``, in its field order
(``_row`` builds one positionally)."""
_SEAL_OF = "s.seq = e.seq AND s.at = e.at"
"""A row's seal: ``at`` too, so that only the seal table's part holding that time is
looked in."""
_SEAL = f"""LEFT JOIN LATERAL (
    SELECT chain_pos, prev_hash, hash, sealed_at FROM audit_seals s WHERE {_SEAL_OF} LIMIT 1
    ) s ON true"""
"""Each audit row ``e``'s seal, looked up through the primary key of its month's part of
``audit_seals`` (``LIMIT 1`` keeps the planner from hashing every seal instead)."""


def _row(record: Record) -> AuditRow:
    return AuditRow(*record)


_OF_CALL = f"""
    SELECT * FROM (
        SELECT {", ".join(CallEvent._fields)}, count(*) OVER () AS total,
            sum(provider_ms) OVER () AS provider_sum,
            first_value(total_ms) OVER (ORDER BY seq
                ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS first_total
        FROM audit_events WHERE call_id = $1 ORDER BY seq DESC LIMIT $2
    ) e ORDER BY seq
"""


class CallEvents(NamedTuple):
    """The newest of a call's audit rows, oldest first, with what all of them add up to."""

    rows: list[CallEvent]
    total: int
    """How many audit rows the call has."""
    decision_ms: float | None
    """How long its first decision took (its first row's ``total_ms``)."""
    provider_ms: float
    """Time spent waiting on its provider, over every row."""


async def of_call(conn: Connection, call_id: str, limit: int) -> CallEvents:
    """One call's newest ``limit`` audit rows as its history shows them (GET /calls/{id}):
    only the columns it shows, so that what refused requests sent is never read."""
    found = await conn.fetch(_OF_CALL, call_id, limit)
    width = len(CallEvent._fields)
    rows = [CallEvent(*r[:width]) for r in found]
    if not found:
        return CallEvents([], 0, None, 0.0)
    first = found[0]
    return CallEvents(rows, first["total"], first["first_total"], first["provider_sum"] or 0.0)


SLACK = "10 seconds"
"""How far ``at`` may run behind ``seq``: both are stamped as a row is inserted, so a row
inserted after another (a higher seq) may carry a slightly earlier time, never seconds
earlier."""
_FIRST_SEQ_SINCE = f"""(SELECT min(seq) FROM (
    SELECT seq FROM audit_events WHERE at >= $0 AND at < $0 + interval '{SLACK}'
    UNION ALL (SELECT seq FROM audit_events WHERE at >= $0 + interval '{SLACK}'
        ORDER BY at LIMIT 1)) s)"""
_LAST_SEQ_UNTIL = f"""(SELECT max(seq) FROM (
    SELECT seq FROM audit_events WHERE at < $0 AND at >= $0 - interval '{SLACK}'
    UNION ALL (SELECT seq FROM audit_events WHERE at < $0 - interval '{SLACK}'
        ORDER BY at DESC LIMIT 1)) s)"""
"""A time window as a seq range, found through ``audit_by_time``: the lowest seq of a row
at or after ``since`` (any such row is among those within ``SLACK`` of it, or is the first
one after), the highest of a row before ``until``. The filter then walks its seq-ordered
index between the two instead of every row since the start."""
_AT = "(at + interval '0 s')"
"""``at`` where the page compares it: the same value, but not one ``audit_by_time`` can
serve, so the page walks its filter's seq-ordered index between the bounds and stops after
a page, instead of reading the whole window by time and sorting it."""


PAGE_BYTES = 4 << 20
"""About how much of the rows' text one page holds: a page ends at the first row that
reaches it (so it holds at least one). A row can be a megabyte (a denied call's raw
arguments), and a thousand of them in one answer would hold a worker's memory."""


class Page(NamedTuple):
    rows: list[AuditRow]
    more: bool
    """Matching rows follow these."""


async def page(conn: Connection, where: AuditFilter, after: int | None, limit: int) -> Page:
    """Up to ``limit`` rows matching ``where`` with ``seq > after``, oldest first (keyset
    pagination), and fewer once their text reaches ``PAGE_BYTES``: measured and cut in
    PostgreSQL, so rows past it are never sent. The page is found in ``audit_events`` alone,
    then joined to its seals."""
    conditions, params = [], []
    for column in ("tenant", "actor", "tool", "call_id", "run_id", "event"):
        value = getattr(where, column)
        if value is not None:
            params.append(value)
            conditions.append(f"{column} = ${len(params)}")
    for condition, value in (
        (f"{_AT} >= $0 AND seq >= {_FIRST_SEQ_SINCE}", where.since),
        (f"{_AT} < $0 AND seq <= {_LAST_SEQ_UNTIL}", where.until),
        ("seq > $0", after),
    ):
        if value is not None:
            params.append(value)
            conditions.append(condition.replace("$0", f"${len(params)}"))
    params += [limit + 1, PAGE_BYTES]
    found = (
        f"SELECT * FROM audit_events{' WHERE ' + ' AND '.join(conditions) if conditions else ''}"
        f" ORDER BY seq LIMIT ${len(params) - 1}"
    )
    sql = f"""
        SELECT {_ROW}, e.candidates FROM (
            SELECT *, sum(size) OVER (ORDER BY seq) - size AS before, count(*) OVER () AS candidates
            FROM (SELECT c.*, octet_length(c::text) AS size FROM ({found}) c) sized
        ) e {_SEAL}
        WHERE e.before < ${len(params)} ORDER BY e.seq"""
    records = await conn.fetch(sql, *params)
    rows = [AuditRow(*r[:-1]) for r in records[:limit]]
    return Page(rows, bool(records) and records[0][-1] > len(rows))


@asynccontextmanager
async def snapshot(conn: Connection) -> AsyncIterator[None]:
    """A read-only transaction seeing one consistent state of the chain: keep it short, as
    every snapshot held back keeps VACUUM from every table's dead rows."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        yield


_SEALED_THROUGH = "coalesce((SELECT sealed_through FROM audit_chain), 0)"
"""The chain head's ``sealed_through``, read in a statement that names ``audit_events``
first (the lock order above). Every row above it is unsealed: the chain moves past a seq
only by sealing it or recording it as a gap."""


async def sealer_lag(conn: Connection) -> tuple[int, float]:
    """Rows above the chain head's ``sealed_through`` (waiting for the sealer) and the age in
    seconds of the oldest of them (0 when there are none); rows late inside gaps, which are
    rare, are left to ``unsealed_count``."""
    row = await one_row(
        conn,
        f"""
        SELECT count(*) AS rows,
               coalesce(extract(epoch FROM clock_timestamp() - min(at)), 0) AS age
        FROM audit_events WHERE seq > {_SEALED_THROUGH}
        """,
    )
    return int(row["rows"]), float(row["age"])


_LATE_IN_GAP = """LATERAL (
    SELECT * FROM audit_events e WHERE seq BETWEEN g.first_seq AND g.last_seq
        AND NOT EXISTS (SELECT 1 FROM audit_seals s WHERE s.seq = e.seq AND s.at = e.at)
    OFFSET 0) e"""
"""The unsealed rows of gap ``g``, through the primary keys (``OFFSET 0`` keeps the planner
from turning this into a join over every row)."""
_UNSEALED = f"""
    (SELECT {_EVENT} FROM audit_events WHERE seq > {_SEALED_THROUGH} ORDER BY seq LIMIT $1)
    UNION ALL
    (SELECT {", ".join(f"e.{c}" for c in _EVENT.split(", "))}
        FROM audit_gaps g, {_LATE_IN_GAP} WHERE g.skipped_at > $2)
    ORDER BY seq LIMIT $1
"""
EVERY_GAP = datetime.min.replace(tzinfo=UTC)


async def unsealed(
    conn: Connection, limit: int, gaps_since: datetime = EVERY_GAP
) -> list[AuditRow]:
    """Up to ``limit`` committed, unsealed rows in seq order: rows above the head's
    ``sealed_through`` (the chain moves past a seq only by sealing it or recording it as a
    gap) and late rows without a seal inside gaps recorded after ``gaps_since``. Both
    through primary keys from where sealing stands, so a pass costs the same however much
    history the tables hold."""
    rows = await conn.fetch(_UNSEALED, limit, gaps_since)
    return [_row(r) for r in rows]


async def unsealed_count(conn: Connection, older_than_s: float = 0.0) -> int:
    """Committed rows not sealed yet, inserted more than ``older_than_s`` ago."""
    return int(
        await conn.fetchval(
            f"""
            WITH t AS (SELECT clock_timestamp() - make_interval(secs => $1) AS before)
            SELECT (SELECT count(*) FROM audit_events, t
                    WHERE seq > {_SEALED_THROUGH} AND at <= t.before)
                + (SELECT count(*) FROM t, audit_gaps g, {_LATE_IN_GAP}
                    WHERE e.at <= t.before)
            """,
            older_than_s,
        )
    )


async def database_now(conn: Connection) -> datetime:
    """The database's clock, the one ``audit_events.at`` is stamped with."""
    return cast(datetime, await conn.fetchval("SELECT clock_timestamp()"))


async def head(conn: Connection) -> Checkpoint | None:
    """The chain head as its latest checkpoint."""
    row = await conn.fetchrow(
        "SELECT chain_pos, hash, sealed_through, updated_at, key_id, signature FROM audit_chain"
    )
    if row is None:
        return None
    chain_pos, hash_, sealed_through, at, key_id, signature = row
    return Checkpoint(chain_pos, hash_, sealed_through, rfc3339(at), key_id, signature)


async def seal(conn: Connection, seals: Sequence[Seal]) -> None:
    """Insert the seals, one statement for all; a row already sealed (its seq taken) fails
    the statement, and with it the pass."""
    await conn.execute(
        """
        INSERT INTO audit_seals (seq, at, chain_pos, prev_hash, hash)
        SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::bigint[], $4::text[],
            $5::text[])
        """,
        [s.seq for s in seals],
        [s.at for s in seals],
        [s.chain_pos for s in seals],
        [s.prev_hash for s in seals],
        [s.hash for s in seals],
    )


async def record_gaps(conn: Connection, gaps: Sequence[Gap]) -> None:
    await conn.executemany(
        "INSERT INTO audit_gaps (first_seq, last_seq, after_pos) VALUES ($1, $2, $3)",
        [(g.first_seq, g.last_seq, g.after_pos) for g in gaps],
    )


async def save_head(conn: Connection, new: Checkpoint) -> None:
    await conn.execute(
        """
        INSERT INTO audit_chain (id, chain_pos, hash, sealed_through, updated_at, key_id,
            signature)
        VALUES (true, $1, $2, $3, $4, $5, $6)
        ON CONFLICT (id) DO UPDATE SET chain_pos = $1, hash = $2, sealed_through = $3,
            updated_at = $4, key_id = $5, signature = $6
        """,
        new.chain_pos,
        new.hash,
        new.sealed_through,
        datetime.fromisoformat(new.at),
        new.key_id,
        new.signature,
    )


async def skipped_count(conn: Connection) -> int:
    """Seqs recorded as skipped and still missing (a late row no longer counts)."""
    return int(
        await conn.fetchval(
            """
            SELECT coalesce(sum(g.last_seq - g.first_seq + 1), 0) - (
                SELECT count(*) FROM audit_events e JOIN audit_gaps g
                    ON e.seq BETWEEN g.first_seq AND g.last_seq)
            FROM audit_gaps g
            """
        )
    )


async def sealed_outside_gaps(
    conn: Connection, sealed_through: int, after_pos: int, through_pos: int, *, inside: bool
) -> tuple[int, int]:
    """Seals at the chain positions after ``after_pos`` up to ``through_pos`` (with
    ``inside=False``, at every other position), and how many of them hold a seq up to
    ``sealed_through`` outside every recorded gap. Through the chain position index, so a
    verification counts a page at a time instead of every seal at once."""
    where = "chain_pos > $2 AND chain_pos <= $3"
    row = await one_row(
        conn,
        f"""
        SELECT count(*), count(*) FILTER (WHERE seq BETWEEN 1 AND $1 AND NOT EXISTS (
            SELECT 1 FROM audit_gaps g WHERE s.seq BETWEEN g.first_seq AND g.last_seq))
        FROM audit_seals s WHERE {where if inside else f"NOT ({where})"}
        """,
        sealed_through,
        after_pos,
        through_pos,
    )
    return int(row[0]), int(row[1])


async def unchained(
    conn: Connection, after: tuple[int, datetime] | None, sealed_through: int, limit: int
) -> Unchained:
    """The next ``limit`` rows after ``after`` (a ``(seq, at)`` read last; ``None`` to start)
    up to seq ``sealed_through``, in ``(seq, at)`` order, and those of them that have no
    seal and lie outside every recorded gap. The chain passed each such seq by sealing it,
    so a row like that was added under a seq another row holds (``seq`` is unique only with
    ``at``: the table is partitioned by time) or under one retention removed; it is neither
    in the chain nor waiting for the sealer, which reads only above ``sealed_through`` and
    inside gaps. Pages follow the primary key, so rows sharing a seq never straddle a page
    unread: one page of each month's index, one seal looked up per row."""
    row = await one_row(
        conn,
        """
        SELECT (array_agg(e.seq ORDER BY e.seq DESC, e.at DESC))[1],
               (array_agg(e.at ORDER BY e.seq DESC, e.at DESC))[1],
               count(*) FILTER (WHERE unchained), min(seq) FILTER (WHERE unchained)
        FROM (SELECT e.seq, e.at, NOT EXISTS (
                    SELECT 1 FROM audit_seals s WHERE s.seq = e.seq AND s.at = e.at)
                AND NOT EXISTS (
                    SELECT 1 FROM audit_gaps g WHERE e.seq BETWEEN g.first_seq AND g.last_seq)
                AS unchained
            FROM (SELECT seq, at FROM audit_events
                WHERE ($1::bigint IS NULL OR (seq, at) > ($1, $2::timestamptz)) AND seq <= $3
                ORDER BY seq, at LIMIT $4) e
            OFFSET 0) e
        """,
        after[0] if after else None,
        after[1] if after else None,
        sealed_through,
        limit,
    )
    last = (row[0], row[1]) if row[0] is not None else None
    return Unchained(last, int(row[2]), row[3])


async def gap_seqs(conn: Connection, sealed_through: int) -> int:
    """Seqs up to ``sealed_through`` inside recorded gaps."""
    return int(
        await conn.fetchval(
            "SELECT coalesce(sum(last_seq - first_seq + 1), 0) FROM audit_gaps"
            " WHERE first_seq >= 1 AND last_seq <= $1",
            sealed_through,
        )
    )


async def hashes_at(conn: Connection, positions: Sequence[int]) -> dict[int, str]:
    rows = await conn.fetch(
        "SELECT chain_pos, hash FROM audit_seals WHERE chain_pos = ANY($1::bigint[])",
        list(positions),
    )
    return {r["chain_pos"]: r["hash"] for r in rows}


async def chain_page(
    conn: Connection, after_pos: int, through_pos: int, limit: int
) -> list[AuditRow]:
    """Sealed rows after chain position ``after_pos`` up to ``through_pos``, in chain
    order."""
    sql = f"""
        SELECT {_ROW} FROM (SELECT * FROM audit_seals WHERE chain_pos > $1 AND chain_pos <= $2
            ORDER BY chain_pos LIMIT $3) s
        JOIN LATERAL (SELECT * FROM audit_events e WHERE {_SEAL_OF} LIMIT 1) e ON true
        ORDER BY s.chain_pos
    """
    return [_row(r) for r in await conn.fetch(sql, after_pos, through_pos, limit)]


async def anchor(conn: Connection) -> Anchor:
    """Where the chain starts: after the rows retention removed, or at the genesis."""
    row = await conn.fetchrow(
        "SELECT chain_pos, hash, at, outside_gaps, retention_days, key_id, signature"
        " FROM audit_anchor"
    )
    return Anchor(*row) if row else Anchor()


# Partitions and retention by month (``app.audit.archive``). Both tables are partitioned by
# the calendar month (UTC) of ``at``, with the same bounds; a month's partitions are named
# ``audit_events_YYYY_MM`` and ``audit_seals_YYYY_MM``.


def _suffix(month: date) -> str:
    return f"{month.year:04d}_{month.month:02d}"


async def create_partitions(conn: Connection, month: date) -> bool:
    """Make ``month``'s partitions if they are missing; whether any was made."""
    return bool(await conn.fetchval("SELECT audit_partitions($1)", month))


async def months(conn: Connection) -> list[date]:
    """The months that have partitions, oldest first (the DEFAULT partition is not one)."""
    names = await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'audit_events'::regclass"
    )
    found = (re.fullmatch(r"audit_events_(\d{4})_(\d{2})", r["relname"]) for r in names)
    return sorted(date(int(m[1]), int(m[2]), 1) for m in found if m)


async def outside_months(conn: Connection) -> int:
    """Rows in the DEFAULT partition: their month had no partition when they came."""
    return int(await conn.fetchval("SELECT count(*) FROM audit_events_default"))


async def unsealed_between(conn: Connection, first: datetime, end: datetime) -> bool:
    """Whether a row written in ``[first, end)`` has no seal yet: above ``sealed_through``,
    or late inside a recorded gap (``unsealed``'s two kinds), both found through keys."""
    return bool(
        await conn.fetchval(
            f"""
            SELECT EXISTS (SELECT 1 FROM audit_events
                    WHERE seq > {_SEALED_THROUGH} AND at >= $1 AND at < $2)
                OR EXISTS (SELECT 1 FROM audit_gaps g, {_LATE_IN_GAP}
                    WHERE e.at >= $1 AND e.at < $2)
            """,
            first,
            end,
        )
    )


async def last_pos_between(conn: Connection, first: datetime, end: datetime) -> int | None:
    """The highest chain position of a row written in ``[first, end)``."""
    sql = "SELECT max(chain_pos) FROM audit_seals WHERE at >= $1 AND at < $2"
    return cast(int | None, await conn.fetchval(sql, first, end))


async def hash_at(conn: Connection, chain_pos: int) -> str:
    return cast(
        str, await conn.fetchval("SELECT hash FROM audit_seals WHERE chain_pos = $1", chain_pos)
    )


async def lock_month(conn: Connection, month: date, timeout: str) -> None:
    """Hold ``month``'s partitions against every reader and writer until the transaction
    ends, waiting at most ``timeout`` (then ``LockNotAvailable``)."""
    await conn.execute(f"SET LOCAL lock_timeout = '{timeout}'")
    suffix = _suffix(month)
    await conn.execute(
        f"LOCK TABLE audit_events_{suffix}, audit_seals_{suffix} IN ACCESS EXCLUSIVE MODE"
    )


async def next_anchor(conn: Connection, anchor: Anchor, last: int, retention_days: int) -> Anchor:
    """The anchor a cut after position ``last`` moves to: that row's hash and time, and the
    removed rows' seqs outside recorded gaps added to the count (unsigned)."""
    row = await one_row(
        conn,
        """
        SELECT s.hash, s.at, ($2::bigint - $1::bigint) - (
            SELECT count(*) FROM audit_gaps g JOIN audit_seals x
                ON x.seq BETWEEN g.first_seq AND g.last_seq
            WHERE x.chain_pos > $1 AND x.chain_pos <= $2)
        FROM audit_seals s WHERE s.chain_pos = $2
        """,
        anchor.chain_pos,
        last,
    )
    return Anchor(last, row[0], row[1], anchor.outside_gaps + row[2], retention_days)


async def remove_month(
    conn: Connection, month: date, first: datetime, end: datetime, anchor: Anchor, moved: Anchor
) -> int:
    """Cut the chain after position ``moved.chain_pos`` (the highest of ``month``'s rows):
    move the anchor there (as retention, under its horizon: the database refuses any other
    move), delete the rows of other months sealed at or below it (rows near the month's
    boundary and late rows), and drop ``month``'s partitions. Run after ``lock_month``, in
    its transaction. The number of chain positions removed."""
    last = moved.chain_pos
    removed = max(last - anchor.chain_pos, 0)
    if removed:
        await conn.execute(
            "SELECT set_config('toolgate.audit_retention_days', $1, true)",
            str(moved.retention_days),
        )
        await conn.execute(
            """
            INSERT INTO audit_anchor
                (chain_pos, hash, at, outside_gaps, retention_days, key_id, signature)
            VALUES ($1, $2, $3, $4, $5, $6, $7)
            ON CONFLICT (id) DO UPDATE SET chain_pos = EXCLUDED.chain_pos,
                hash = EXCLUDED.hash, at = EXCLUDED.at, outside_gaps = EXCLUDED.outside_gaps,
                retention_days = EXCLUDED.retention_days, key_id = EXCLUDED.key_id,
                signature = EXCLUDED.signature, updated_at = now()
            """,
            moved.chain_pos,
            moved.hash,
            moved.at,
            moved.outside_gaps,
            moved.retention_days,
            moved.key_id,
            moved.signature,
        )
        others = "s.chain_pos > $1 AND s.chain_pos <= $2 AND (s.at < $3 OR s.at >= $4)"
        args = (anchor.chain_pos, last, first, end)
        await conn.execute(
            f"DELETE FROM audit_events e USING audit_seals s WHERE {others}"
            " AND s.seq = e.seq AND s.at = e.at",
            *args,
        )
        await conn.execute(f"DELETE FROM audit_seals s WHERE {others}", *args)
    suffix = _suffix(month)
    await conn.execute(f"DROP TABLE audit_events_{suffix}, audit_seals_{suffix}")
    return removed


async def record_archive(conn: Connection, archived: Archived) -> None:
    await conn.execute(
        """
        INSERT INTO audit_archives (file, month, first_pos, last_pos, prev_hash, last_hash,
            rows, sha256)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        """,
        *(getattr(archived, f.name) for f in fields(Archived)),
    )


async def archives(conn: Connection) -> list[Archived]:
    """Every archive file recorded, in chain order."""
    rows = await conn.fetch(
        f"SELECT {', '.join(f.name for f in fields(Archived))} FROM audit_archives"
        " ORDER BY first_pos"
    )
    return [Archived(*r) for r in rows]
