"""SQL for known values, and the one statement that gathers what can endorse a call."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from app.db import Connection, columns


class KnownRow(NamedTuple):
    tenant: str
    kind: str
    digest: str
    value: str | None
    """The value as given, or ``None`` for a sensitive one (only its digest is kept)."""
    added_by: str
    user_sub: str | None = None
    """Scope ``user``: the value endorses only this user's calls; ``None``: the tenant's."""
    call_id: str | None = None
    """The call whose approvals vouched for it; ``None``: an admin's."""
    until: datetime | None = None
    """Until when it endorses, while its call has not started; ``None``: for good."""
    added_at: datetime | None = None


_COLUMNS = columns(KnownRow)
_ONCE = "(tenant, kind, digest, (coalesce(user_sub, '')))"
"""A value is known once per scope (``known_values_once``)."""
_ENDORSES = "(until IS NULL OR until > now())"


async def add(conn: Connection, row: KnownRow) -> bool:
    """Whether ``row`` is new, or takes over a value that was only pending (a call's,
    awaiting its run): a value known for good stays as it is."""
    status = await conn.execute(
        "INSERT INTO known_values (tenant, kind, digest, value, added_by, user_sub, call_id, until)"
        f" VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT {_ONCE} DO UPDATE"
        " SET added_by = $5, call_id = $7, until = $8, added_at = now()"
        " WHERE known_values.until IS NOT NULL",
        *row[:8],
    )
    return bool(status.endswith(" 1"))


async def withdraw(conn: Connection, call_id: str) -> list[KnownRow]:
    """Remove what the call's approvals vouched for and it has not used (it never started)."""
    rows = await conn.fetch(
        f"DELETE FROM known_values WHERE call_id = $1 AND until IS NOT NULL RETURNING {_COLUMNS}",
        call_id,
    )
    return [KnownRow(*r) for r in rows]


async def remove(conn: Connection, tenant: str, kind: str, digests: list[str]) -> list[KnownRow]:
    """Remove a value in every scope, under any of its ``digests`` (one per key)."""
    rows = await conn.fetch(
        "DELETE FROM known_values WHERE tenant = $1 AND kind = $2 AND digest = ANY($3)"
        f" RETURNING {_COLUMNS}",
        tenant,
        kind,
        digests,
    )
    return [KnownRow(*r) for r in rows]


async def page(
    conn: Connection, tenant: str, kind: str, after: tuple[str, str] | None, limit: int
) -> list[tuple[KnownRow, str]]:
    """A kind's values that endorse now, each with its place after its digest (``md5`` of
    its user, '' for the tenant's: a text a cursor can carry, whatever the user's name), in
    digest order then that place, after ``after``: the index on the digest gives the order,
    and the few rows of one digest are sorted among themselves."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS}, md5(coalesce(user_sub, '')) AS place FROM known_values"
        f" WHERE tenant = $1 AND kind = $2 AND {_ENDORSES}"
        "   AND ($3::text IS NULL OR (digest, md5(coalesce(user_sub, ''))) > ($3, $4))"
        " ORDER BY digest, place LIMIT $5",
        tenant,
        kind,
        after[0] if after else None,
        after[1] if after else "",
        limit,
    )
    return [(KnownRow(*r[:-1]), r[-1]) for r in rows]


async def sources(
    conn: Connection,
    tenant: str,
    user: str,
    run_id: str | None,
    digests: list[str],
    held_chars: int,
) -> tuple[int, list[str] | None, frozenset[str]]:
    """What can endorse a call, in one statement: how many characters of trusted results
    its run keeps, and their words unless the caller holds them already (``held_chars``,
    -1 for none), and which of ``digests`` are known values that endorse a call of ``user``
    now: the tenant's, and the user's own."""
    row = await conn.fetchrow(
        f"""
        SELECT coalesce(m.trusted_chars, 0) AS chars,
            CASE WHEN coalesce(m.trusted_chars, 0) <> $4 THEN m.trusted END AS trusted,
            ARRAY(SELECT digest FROM known_values
                  WHERE tenant = $2 AND digest = ANY($3)
                    AND (user_sub IS NULL OR user_sub = $5) AND {_ENDORSES}) AS known
        FROM (VALUES (1)) AS one LEFT JOIN run_memory m ON m.run_id = $1
        """,
        run_id,
        tenant,
        digests,
        held_chars,
        user,
    )
    assert row is not None  # one row, joined or not
    trusted = row["trusted"]
    return row["chars"], None if trusted is None else list(trusted), frozenset(row["known"])


async def not_under(conn: Connection, prefix: str) -> list[KnownRow]:
    """Every value whose digest was not made under the key ``prefix`` names (an older key,
    or the plain digests of before keys), to digest again or remove."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM known_values WHERE NOT starts_with(digest, $1)"
        " ORDER BY tenant, kind, digest",
        prefix,
    )
    return [KnownRow(*r) for r in rows]


async def redigest(conn: Connection, row: KnownRow, digest: str) -> None:
    """Store ``row`` under ``digest`` instead (as it is, if the value is known under it
    already in the same scope)."""
    await conn.execute(
        f"""
        WITH gone AS (
            DELETE FROM known_values
            WHERE tenant = $1 AND kind = $2 AND digest = $3
              AND user_sub IS NOT DISTINCT FROM $4
        )
        INSERT INTO known_values ({_COLUMNS})
        VALUES ($1, $2, $5, $6, $7, $4, $8, $9, $10) ON CONFLICT DO NOTHING
        """,
        row.tenant,
        row.kind,
        row.digest,
        row.user_sub,
        digest,
        row.value,
        row.added_by,
        row.call_id,
        row.until,
        row.added_at,
    )


async def drop(conn: Connection, row: KnownRow) -> None:
    await conn.execute(
        "DELETE FROM known_values WHERE tenant = $1 AND kind = $2 AND digest = $3"
        " AND user_sub IS NOT DISTINCT FROM $4",
        row.tenant,
        row.kind,
        row.digest,
        row.user_sub,
    )
