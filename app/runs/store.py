"""SQL for runs. Admission is one conditional UPDATE: a limit can never be overspent by
parallel calls."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import NamedTuple

from app.db import Connection, Insert, Writer, columns, write_one
from app.runs.models import RunCall, RunRow

_COLUMNS = columns(RunRow)
_INSERT = Insert.of(
    "runs", RunRow._fields, ["calls", "cost", "failures", "created_at", "updated_at", "finished_at"]
)


async def insert(conn: Connection, run: RunRow) -> None:
    await conn.execute(_INSERT.sql, *_INSERT.values(run))


async def get(conn: Connection, run_id: str, *, lock: bool = False) -> RunRow | None:
    """The run; with ``lock``, its row locked until the transaction ends, so that what is
    read (status, counters) is what a later change in the same transaction acts on."""
    sql = f"SELECT {_COLUMNS} FROM runs WHERE id = $1" + (" FOR UPDATE" if lock else "")
    row = await conn.fetchrow(sql, run_id)
    return RunRow(*row) if row else None


_ADMIT = """
    UPDATE runs SET calls = calls + $2, cost = cost + $3, updated_at = now()
    WHERE id = $1 AND status = 'active'
      AND calls + $2 <= max_calls AND cost + $3 <= max_cost AND failures < max_failures
      AND now() <= created_at + make_interval(secs => max_seconds)
"""


async def admit(conn: Connection, run_id: str, calls: int, cost: float) -> bool:
    """Count ``calls`` more calls and ``cost`` more units if every limit still holds."""
    status = await conn.execute(_ADMIT, run_id, calls, cost)
    return bool(status.endswith(" 1"))


ADMIT_AT_ONCE = f"""
    WITH admitted AS ({_ADMIT}
      AND (tenant, actor) IS NOT DISTINCT FROM ($4::text, $5::text)
      AND ($6::text IS NULL OR coalesce(
          (SELECT count FROM run_repeats WHERE run_id = $1 AND fingerprint = $6), 0)
          < max_repeats)
      AND ($7::text IS NULL OR scope_tools IS NULL OR $7 = ANY(scope_tools))
      RETURNING 1)
    SELECT count(*) FROM admitted
"""


async def admit_at_once(
    writer: Writer,
    run_id: str,
    tenant: str,
    actor: str,
    fingerprint: str | None,
    calls: int,
    cost: float,
    within: str | None = None,
) -> bool:
    """``admit``, in one statement, for ``actor``'s own run whose same call (by
    ``fingerprint``) has not failed or come back empty ``max_repeats`` times, and whose
    scope, if it has one, holds the tool ``within`` (if given): the common
    case, in the caller's transaction or committed with concurrent ones (``write_one``).
    ``False`` says only that it did not; the caller then decides under the run's lock why.
    The owner is compared with ``IS NOT DISTINCT FROM``, which no index serves, so that the
    run is found by its id: with ``=``, a planner without statistics of the table yet (a new
    deployment) took the index of the actor's runs and read every run of theirs to admit
    one call (measured: 0.3 ms of PostgreSQL for 400 runs, growing with each run)."""
    admitted = await write_one(
        writer,
        ADMIT_AT_ONCE,
        run_id,
        calls,
        cost,
        tenant,
        actor,
        fingerprint,
        within,
        order=run_id,
    )
    return bool(admitted)


async def refund(conn: Connection, run_id: str, cost: float) -> None:
    """Give back the cost of an execution that certainly never ran."""
    await conn.execute("UPDATE runs SET cost = greatest(cost - $2, 0) WHERE id = $1", run_id, cost)


async def count_call(conn: Connection, run_id: str) -> None:
    """A denied call still counts as a call of the loop, whatever the limits say."""
    await conn.execute(
        "UPDATE runs SET calls = calls + 1, updated_at = now() WHERE id = $1", run_id
    )


async def repeats(conn: Connection, run_id: str, fingerprint: str) -> int:
    count = await conn.fetchval(
        "SELECT count FROM run_repeats WHERE run_id = $1 AND fingerprint = $2",
        run_id,
        fingerprint,
    )
    return int(count or 0)


async def finish(
    conn: Connection,
    run_id: str,
    status: str,
    reason: str | None,
    *,
    recoverable: bool | None = None,
    limit_name: str | None = None,
) -> bool:
    """End an active run; ``False`` when it had already ended."""
    result = await conn.execute(
        """
        UPDATE runs SET status = $2, reason = $3, recoverable = $4, limit_name = $5,
                        finished_at = now(), updated_at = now()
        WHERE id = $1 AND status = 'active'
        """,
        run_id,
        status,
        reason,
        recoverable,
        limit_name,
    )
    return bool(result.endswith(" 1"))


async def awaiting_approval(conn: Connection, run_id: str) -> bool:
    return bool(
        await conn.fetchval(
            """
            SELECT EXISTS (
                SELECT 1 FROM calls
                WHERE run_id = $1 AND state = 'awaiting_approval' AND pending_until > now()
            )
            """,
            run_id,
        )
    )


async def calls_of(conn: Connection, run_id: str) -> list[RunCall]:
    """The run's calls, oldest first, as ``GET /runs/{id}`` lists them."""
    rows = await conn.fetch(
        """
        SELECT id AS call_id, tool, decision, code, state, impact, created_at FROM calls
        WHERE run_id = $1 ORDER BY created_at, id
        """,
        run_id,
    )
    return [
        {
            "call_id": r["call_id"],
            "tool": r["tool"],
            "decision": r["decision"],
            "code": r["code"],
            "state": r["state"],
            "impact": r["impact"],
            "created_at": r["created_at"].isoformat(),
        }
        for r in rows
    ]


# Provenance: the windows a run remembers (``app.runs.provenance``).


HEAVY_WINDOWS = 10_000
"""Windows of one result past which it is recorded in a transaction of its own."""


class Told(NamedTuple):
    """What one result tells its run (``telling`` stores it)."""

    run_id: str
    fingerprint: str
    failed: bool
    """Counts as a failure of the run, and as a repeat of the call."""
    empty: bool
    """Counts as a repeat of the call."""
    windows: list[int] | None
    """The windows of the result's untrusted strings, to remember (``None``: none)."""
    call_id: str
    """The call the result answered: the source of its windows."""
    overflow: bool
    """The result had more windows than a run holds: the run forgets from here."""
    trusted: str | None
    """A trusted result's words, to endorse by (``None``: none)."""
    most_windows: int
    most_trusted: int

    @property
    def heavy(self) -> bool:
        """Too many windows to store beside other requests' statements in a group commit:
        storing them takes long enough to hold that group up (``HEAVY_WINDOWS``)."""
        return self.windows is not None and len(self.windows) > HEAVY_WINDOWS


@cache
def telling(first: int) -> str:
    """Data-modifying CTEs that store what a result tells its run (``Told``'s fields as
    parameters ``$first`` on): the failure and repeat counters; the windows the run did not
    hold yet, while they fit (else, from this call on, the run has forgotten: every judged
    argument counts as tainted); the trusted words, while they fit. One statement with the
    call's own record (``calls.store``), or on its own.

    The memory row is written as if the run remembered nothing yet (``EXCLUDED``: the new
    windows and words, or the call it forgets from when they do not fit even then), or, when
    it has a row, added to it under the row's lock, which orders the results of one run.
    The windows counted new are those the statement's snapshot did not hold, so concurrent
    results of one run may count a window twice: the bound then holds early, never late."""
    types = ("text", "text", "boolean", "boolean", "bigint[]", "text", "boolean", "text")
    (run, fingerprint, failed, empty, windows, call, overflow, trusted, most, most_trusted) = (
        f"${first + i}::{kind}" for i, kind in enumerate((*types, "int", "int"))
    )
    alone = f"(NOT {overflow} AND f.n <= {most})"
    kept = f"({trusted} IS NOT NULL AND length({trusted}) <= {most_trusted})"
    fits = (
        "(m.forgotten_after IS NULL AND EXCLUDED.forgotten_after IS NULL"
        f" AND m.windows + EXCLUDED.windows <= {most})"
    )
    keep = (
        "(EXCLUDED.trusted_chars > 0"
        f" AND m.trusted_chars + EXCLUDED.trusted_chars <= {most_trusted})"
    )
    return f"""
    run_failed AS (
        UPDATE runs SET failures = failures + 1, updated_at = now()
        WHERE id = {run} AND {failed} RETURNING 1),
    run_repeated AS (
        INSERT INTO run_repeats (run_id, fingerprint, count)
        SELECT {run}, {fingerprint}, 1 WHERE {failed} OR {empty}
        ON CONFLICT (run_id, fingerprint) DO UPDATE SET count = run_repeats.count + 1
        RETURNING 1),
    run_fresh AS (
        SELECT DISTINCT w FROM unnest({windows}) w
        WHERE NOT EXISTS (SELECT 1 FROM run_windows x WHERE x.run_id = {run} AND x.window_id = w)),
    run_told AS (
        INSERT INTO run_memory AS m (run_id, windows, forgotten_after, trusted, trusted_chars)
        SELECT {run},
            CASE WHEN {alone} THEN f.n ELSE 0 END,
            CASE WHEN {alone} THEN NULL ELSE {call} END,
            CASE WHEN {kept} THEN ARRAY[{trusted}] ELSE '{{}}' END,
            CASE WHEN {kept} THEN length({trusted}) ELSE 0 END
        FROM (SELECT count(*)::int AS n FROM run_fresh) f
        WHERE {windows} IS NOT NULL OR {overflow} OR {trusted} IS NOT NULL
        ON CONFLICT (run_id) DO UPDATE SET
            windows = m.windows + CASE WHEN {fits} THEN EXCLUDED.windows ELSE 0 END,
            forgotten_after = CASE WHEN {fits} THEN NULL
                              ELSE coalesce(m.forgotten_after, {call}) END,
            trusted = CASE WHEN {keep} THEN m.trusted || EXCLUDED.trusted ELSE m.trusted END,
            trusted_chars = m.trusted_chars
                            + CASE WHEN {keep} THEN EXCLUDED.trusted_chars ELSE 0 END
        RETURNING m.forgotten_after IS NULL AS fits),
    run_remembered AS (
        INSERT INTO run_windows (run_id, window_id, source_call_id)
        SELECT {run}, w, {call} FROM run_fresh WHERE (SELECT fits FROM run_told)
        ON CONFLICT (run_id, window_id) DO NOTHING RETURNING 1)"""


async def tell(writer: Writer, result: Told) -> None:
    """Store what ``result`` tells its run, on its own (``telling``)."""
    await write_one(writer, f"WITH {telling(1)} SELECT 1", *result, order=result.run_id)


async def set_scope(conn: Connection, run_id: str, tools: list[str], outside: str) -> None:
    await conn.execute(
        "UPDATE runs SET scope_tools = $2, scope_outside = $3, updated_at = now() WHERE id = $1",
        run_id,
        tools,
        outside,
    )


async def recall(
    conn: Connection, run_id: str, windows: list[int]
) -> tuple[str | None, str | None, dict[int, str]]:
    """The run's task, ``forgotten_after``, and which of ``windows`` it remembers (with
    their source calls): one statement, one index probe per window."""
    rows = await conn.fetch(
        """
        SELECT r.task, m.forgotten_after, w.window_id, w.source_call_id
        FROM runs r
        LEFT JOIN run_memory m ON m.run_id = r.id
        LEFT JOIN run_windows w ON w.run_id = r.id AND w.window_id = ANY($2::bigint[])
        WHERE r.id = $1
        """,
        run_id,
        windows,
    )
    if not rows:
        return None, None, {}
    found = {r["window_id"]: r["source_call_id"] for r in rows if r["window_id"] is not None}
    return rows[0]["task"], rows[0]["forgotten_after"], found


_ENDED = """
    SELECT m.run_id FROM run_memory m LEFT JOIN runs r ON r.id = m.run_id
    WHERE r.id IS NULL OR r.status <> 'active'
       OR now() > r.created_at + make_interval(secs => r.max_seconds)
"""
"""Runs that remember something and have ended, outlived their max_seconds, or are gone."""


async def forget_ended(conn: Connection, limit: int) -> int:
    """Forget up to ``limit`` windows that ended runs remembered; a run's memory goes with
    its last window. The number of windows forgotten."""
    status = await conn.execute(
        f"""
        DELETE FROM run_windows WHERE (run_id, window_id) IN (
            SELECT run_id, window_id FROM run_windows
            WHERE run_id IN ({_ENDED}) LIMIT $1)
        """,
        limit,
    )
    forgotten = int(status.split()[-1])
    if forgotten < limit:
        await conn.execute(
            f"""
            DELETE FROM run_memory WHERE run_id IN ({_ENDED})
            AND NOT EXISTS (SELECT 1 FROM run_windows w WHERE w.run_id = run_memory.run_id)
            """
        )
    return forgotten


async def remove_before(conn: Connection, before: datetime, limit: int) -> int:
    """Remove up to ``limit`` runs started before ``before``, oldest first, with their repeat
    counters. The number removed."""
    status = await conn.execute(
        """
        WITH doomed AS (SELECT id FROM runs WHERE created_at < $1 ORDER BY created_at LIMIT $2),
        repeats AS (DELETE FROM run_repeats WHERE run_id IN (SELECT id FROM doomed))
        DELETE FROM runs WHERE id IN (SELECT id FROM doomed)
        """,
        before,
        limit,
    )
    return int(status.split()[-1])
