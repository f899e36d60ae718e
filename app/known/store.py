"""SQL for known values, and the one statement that gathers what can endorse a call."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from app.db import Connection


class KnownRow(NamedTuple):
    kind: str
    digest: str
    value: str | None
    added_by: str
    added_at: datetime


async def add(
    conn: Connection, tenant: str, kind: str, digest: str, value: str | None, added_by: str
) -> bool:
    """Whether the value was new (adding it again changes nothing)."""
    status = await conn.execute(
        "INSERT INTO known_values (tenant, kind, digest, value, added_by)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        tenant,
        kind,
        digest,
        value,
        added_by,
    )
    return bool(status.endswith(" 1"))


async def remove(conn: Connection, tenant: str, kind: str, digest: str) -> bool:
    status = await conn.execute(
        "DELETE FROM known_values WHERE tenant = $1 AND kind = $2 AND digest = $3",
        tenant,
        kind,
        digest,
    )
    return bool(status.endswith(" 1"))


async def page(
    conn: Connection, tenant: str, kind: str, after: str | None, limit: int
) -> list[KnownRow]:
    """A kind's values in digest order, after the digest ``after``."""
    rows = await conn.fetch(
        "SELECT kind, digest, value, added_by, added_at FROM known_values"
        " WHERE tenant = $1 AND kind = $2 AND ($3::text IS NULL OR digest > $3)"
        " ORDER BY digest LIMIT $4",
        tenant,
        kind,
        after,
        limit,
    )
    return [KnownRow(*r) for r in rows]


async def sources(
    conn: Connection, tenant: str, run_id: str | None, digests: list[str], held_chars: int
) -> tuple[int, list[str] | None, frozenset[str]]:
    """What can endorse a call, in one statement: how many characters of trusted results
    its run keeps, and their words unless the caller holds them already (``held_chars``,
    -1 for none), and which of ``digests`` are known values of the tenant."""
    row = await conn.fetchrow(
        """
        SELECT coalesce(m.trusted_chars, 0) AS chars,
            CASE WHEN coalesce(m.trusted_chars, 0) <> $4 THEN m.trusted END AS trusted,
            ARRAY(SELECT digest FROM known_values WHERE tenant = $2 AND digest = ANY($3))
                AS known
        FROM (VALUES (1)) AS one LEFT JOIN run_memory m ON m.run_id = $1
        """,
        run_id,
        tenant,
        digests,
        held_chars,
    )
    assert row is not None  # one row, joined or not
    trusted = row["trusted"]
    return row["chars"], None if trusted is None else list(trusted), frozenset(row["known"])
