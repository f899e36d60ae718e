"""SQL for the audit trail. Writing: callers pass their open transaction, so a row commits
with the state change it describes or not at all. Reading and sealing: below."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, cast

from app.audit.models import AuditFilter, AuditRow, ChainHead, Gap, Seal
from app.db import Connection, Insert, Record


@dataclass(frozen=True)
class AuditEvent:
    event: str
    tenant: str
    actor: str
    call_id: str | None = None
    run_id: str | None = None
    tool: str | None = None
    target: dict[str, str] | None = None
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


_INSERT = Insert.of("audit_events", AuditEvent)
_COLUMNS = _INSERT.columns


async def append(conn: Connection, event: AuditEvent) -> None:
    await conn.execute(_INSERT.sql, *_INSERT.values(event))


_AFTER: dict[tuple[str, int], str] = {}


async def append_after(
    conn: Connection, changes: str, args: Sequence[Any], event: AuditEvent
) -> bool:
    """Apply ``changes`` — data-modifying CTEs, the first named ``change`` and ``RETURNING``
    the rows it touched — and append ``event`` only if ``change`` touched a row, all in one
    statement: atomic even outside a transaction, and one round trip instead of four."""
    key = (changes, len(args))
    sql = _AFTER.get(key)
    if sql is None:
        first = len(args) + 1
        params = ", ".join(f"${i}" for i in range(first, first + len(_COLUMNS)))
        sql = _AFTER[key] = (
            f"WITH {changes} INSERT INTO audit_events ({', '.join(_COLUMNS)}) "
            f"SELECT {params} WHERE EXISTS (SELECT 1 FROM change)"
        )
    status = await conn.execute(sql, *args, *_INSERT.values(event))
    return bool(status.endswith(" 1"))


async def of_call(conn: Connection, call_id: str) -> list[Record]:
    """One call's audit rows, oldest first (GET /calls/{id})."""
    return list(
        await conn.fetch("SELECT * FROM audit_events WHERE call_id = $1 ORDER BY seq", call_id)
    )


# Reading and sealing. A transaction that touches several audit tables reads
# ``audit_events`` first: TRUNCATE locks it before ``audit_chain``/``audit_gaps``, so the
# same order on both sides cannot deadlock.

_ROW = ", ".join(f.name for f in fields(AuditRow))
"""Every column of ``AuditRow``, in its field order (``_row`` builds one positionally)."""
SEALER_LOCK = 74202
"""Advisory lock key: one sealer at a time across every instance on this database."""


def _row(record: Record) -> AuditRow:
    return AuditRow(*record)


async def page(
    conn: Connection, where: AuditFilter, after: int | None, limit: int
) -> list[AuditRow]:
    """Rows matching ``where`` with ``seq > after``, oldest first (keyset pagination)."""
    conditions, params = [], []
    for column in ("tenant", "actor", "tool", "call_id", "run_id", "event"):
        value = getattr(where, column)
        if value is not None:
            params.append(value)
            conditions.append(f"{column} = ${len(params)}")
    for column, operator, value in (
        ("at", ">=", where.since),
        ("at", "<", where.until),
        ("seq", ">", after),
    ):
        if value is not None:
            params.append(value)
            conditions.append(f"{column} {operator} ${len(params)}")
    params.append(limit)
    sql = (
        f"SELECT {_ROW} FROM audit_events"
        f"{' WHERE ' + ' AND '.join(conditions) if conditions else ''}"
        f" ORDER BY seq LIMIT ${len(params)}"
    )
    return [_row(r) for r in await conn.fetch(sql, *params)]


@asynccontextmanager
async def snapshot(conn: Connection) -> AsyncIterator[None]:
    """A read-only transaction seeing one consistent state of the chain."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        yield


async def try_lock_sealer(conn: Connection) -> bool:
    """Become the one sealer until this transaction ends; False if another one is."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", SEALER_LOCK))


async def unsealed(conn: Connection, limit: int) -> list[AuditRow]:
    """Committed rows not sealed yet, in seq order."""
    sql = f"SELECT {_ROW} FROM audit_events WHERE hash IS NULL ORDER BY seq LIMIT $1"
    return [_row(r) for r in await conn.fetch(sql, limit)]


async def unsealed_count(conn: Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM audit_events WHERE hash IS NULL"))


async def database_now(conn: Connection) -> datetime:
    """The database's clock, the one ``audit_events.at`` is stamped with."""
    return cast(datetime, await conn.fetchval("SELECT clock_timestamp()"))


async def head(conn: Connection) -> ChainHead | None:
    row = await conn.fetchrow("SELECT chain_pos, hash, sealed_through FROM audit_chain")
    return ChainHead(**dict(row)) if row else None


async def seal(conn: Connection, seals: Sequence[Seal]) -> None:
    """Write the chain columns; every row must still be unsealed, or nothing is written."""
    status = await conn.execute(
        """
        UPDATE audit_events AS a
        SET chain_pos = s.chain_pos, prev_hash = s.prev_hash, hash = s.hash,
            sealed_at = clock_timestamp()
        FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[])
            AS s(seq, chain_pos, prev_hash, hash)
        WHERE a.seq = s.seq AND a.hash IS NULL
        """,
        [s.seq for s in seals],
        [s.chain_pos for s in seals],
        [s.prev_hash for s in seals],
        [s.hash for s in seals],
    )
    if status != f"UPDATE {len(seals)}":
        raise RuntimeError(f"sealing expected {len(seals)} unsealed rows, got {status!r}")


async def record_gaps(conn: Connection, gaps: Sequence[Gap]) -> None:
    await conn.executemany(
        "INSERT INTO audit_gaps (first_seq, last_seq, after_pos) VALUES ($1, $2, $3)",
        [(g.first_seq, g.last_seq, g.after_pos) for g in gaps],
    )


async def save_head(conn: Connection, new: ChainHead) -> None:
    await conn.execute(
        """
        INSERT INTO audit_chain (id, chain_pos, hash, sealed_through) VALUES (true, $1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET chain_pos = $1, hash = $2, sealed_through = $3,
            updated_at = now()
        """,
        new.chain_pos,
        new.hash,
        new.sealed_through,
    )


async def skipped_count(conn: Connection) -> int:
    """Seqs recorded as skipped and still missing (a late row no longer counts)."""
    return int(
        await conn.fetchval(
            """
            SELECT coalesce(sum(g.last_seq - g.first_seq + 1), 0) - (
                SELECT count(*) FROM audit_events a JOIN audit_gaps g
                    ON a.seq BETWEEN g.first_seq AND g.last_seq)
            FROM audit_gaps g
            """
        )
    )


async def chain_page(conn: Connection, after_pos: int, limit: int) -> list[AuditRow]:
    """Sealed rows after chain position ``after_pos``, in chain order."""
    sql = f"SELECT {_ROW} FROM audit_events WHERE chain_pos > $1 ORDER BY chain_pos LIMIT $2"
    return [_row(r) for r in await conn.fetch(sql, after_pos, limit)]
