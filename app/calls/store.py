"""SQL for calls, dry-runs and execution records. Functions take the caller's connection;
the use case owns the transaction. Those of one statement atomic by itself also take the
``Database``, outside a transaction: their statement then commits in a batch with
concurrent requests' (``Database.fetchval``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from app.audit.store import AuditEvent, append_after
from app.calls import answers
from app.calls.models import CallRow, DryRunRow, ExecutionRow, ExecutionSummary
from app.calls.states import FINAL, CallState, ExecutionState
from app.db import Connection, Insert, Writer, columns, write_one
from app.runs import store as runs

_GENERATED = ("created_at", "updated_at")
_CALL = Insert.of("calls", CallRow._fields, _GENERATED)
_CALL_COLUMNS = columns(CallRow)
_DRY_RUN_COLUMNS = columns(DryRunRow)
_EXECUTION_COLUMNS = columns(ExecutionRow)
_DRY_RUN = Insert.of("dry_runs", DryRunRow._fields, _GENERATED)
_EXECUTION = Insert.of("executions", ExecutionRow._fields, _GENERATED)
_CLAIM_NEW = _EXECUTION.sql + " ON CONFLICT (tenant, actor, idempotency_key) DO NOTHING"


async def insert(conn: Connection, call: CallRow) -> None:
    await conn.execute(_CALL.sql, *_CALL.values(call))


async def get(conn: Connection, call_id: str) -> CallRow | None:
    row = await conn.fetchrow(f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = $1", call_id)
    return CallRow(*row) if row else None


async def insert_with_audit(
    conn: Writer, call: CallRow, event: AuditEvent, told: runs.Told | None = None
) -> None:
    """The call and its audit row, and what its result ``told`` its run, in one statement."""
    await _append_after(
        conn, f"change AS ({_CALL.sql} RETURNING 1)", _CALL.values(call), event, told
    )


async def set_state_with_audit(
    conn: Writer,
    call_id: str,
    state: CallState,
    event: AuditEvent,
    *,
    keep: tuple[CallState, ...] = FINAL,
    told: runs.Told | None = None,
) -> None:
    """Record ``event`` and move the call to ``state``, unless the call is already in one of
    the states ``keep``, by default past deciding (``FINAL``): a later denial is audited but
    never rewrites a rejection or an execution that began. With what its result ``told`` its
    run: one statement."""
    await _append_after(
        conn,
        "change AS (UPDATE calls SET state = CASE WHEN state = ANY($3) THEN state ELSE $2 END,"
        " updated_at = now() WHERE id = $1 RETURNING 1)",
        (call_id, state, list(keep)),
        event,
        told,
    )


async def _append_after(
    conn: Writer, change: str, args: tuple[Any, ...], event: AuditEvent, told: runs.Told | None
) -> None:
    """``append_after``, and, in the same statement, what the result ``told`` its run."""
    if told is None:
        await append_after(conn, change, args, event)
    else:  # the run's rows locked in the order of its id, in any group (``write_one``)
        change, args = f"{change}, {runs.telling(len(args) + 1)}", (*args, *told)
        await append_after(conn, change, args, event, order=told.run_id)


async def set_state(
    conn: Connection,
    call_id: str,
    state: CallState,
    *,
    unless: tuple[CallState, ...] = (),
    pending_until: datetime | None = None,
) -> bool:
    """Move the call to ``state`` (awaiting approval until ``pending_until``), unless it is
    in one of the states ``unless``; whether it moved."""
    status = await conn.execute(
        "UPDATE calls SET state = $2, pending_until = $4, updated_at = now()"
        " WHERE id = $1 AND state <> ALL($3)",
        call_id,
        state,
        list(unless),
        pending_until,
    )
    return bool(status.endswith(" 1"))


async def lock(conn: Connection, call_id: str) -> str:
    """Hold the call's row until the transaction ends and return its state. A decision on the
    call takes the lock here, an execution by moving the call to executing; so of the two,
    the later one sees what the earlier one wrote."""
    return str(await conn.fetchval("SELECT state FROM calls WHERE id = $1 FOR UPDATE", call_id))


async def insert_dry_run(conn: Connection, dry_run: DryRunRow) -> None:
    await conn.execute(_DRY_RUN.sql, *_DRY_RUN.values(dry_run))


async def latest_dry_run(conn: Connection, call_id: str) -> DryRunRow | None:
    row = await conn.fetchrow(
        f"SELECT {_DRY_RUN_COLUMNS} FROM dry_runs WHERE call_id = $1"
        " ORDER BY created_at DESC, id LIMIT 1",
        call_id,
    )
    return DryRunRow(*row) if row else None


async def dry_run_for(
    conn: Connection, tenant: str, actor: str, fingerprint: str, dry_run_id: str | None
) -> DryRunRow | None:
    """The named dry-run, or the latest one, of this actor's call with this fingerprint."""
    row = await conn.fetchrow(
        f"""
        SELECT {_DRY_RUN_COLUMNS} FROM dry_runs
        WHERE tenant = $1 AND actor = $2 AND fingerprint = $3 AND ($4::text IS NULL OR id = $4)
        ORDER BY created_at DESC, id LIMIT 1
        """,
        tenant,
        actor,
        fingerprint,
        dry_run_id,
    )
    return DryRunRow(*row) if row else None


async def get_execution(conn: Connection, tenant: str, actor: str, key: str) -> ExecutionRow | None:
    """The live record for this key; finished records past their retention do not count."""
    row = await conn.fetchrow(
        f"""
        SELECT {_EXECUTION_COLUMNS} FROM executions
        WHERE tenant = $1 AND actor = $2 AND idempotency_key = $3
          AND NOT (state IN ('succeeded', 'failed') AND expires_at <= now())
        """,
        tenant,
        actor,
        key,
    )
    return ExecutionRow(*row) if row else None


_CALL_PARAMS = range(len(_EXECUTION.columns) + 1, len(_EXECUTION.columns) + len(_CALL.columns) + 1)
_CLAIM = f"WITH claim AS ({_CLAIM_NEW} RETURNING 1) SELECT count(*) FROM claim"
_CLAIM_WITH_CALL = (
    f"WITH claim AS ({_CLAIM_NEW} RETURNING 1), call AS (INSERT INTO calls"
    f" ({', '.join(_CALL.columns)}) SELECT {', '.join(f'${i}' for i in _CALL_PARAMS)}"
    " WHERE EXISTS (SELECT 1 FROM claim)) SELECT count(*) FROM claim"
)
_FORGET_EXPIRED = """
    WITH gone AS (
        DELETE FROM executions
        WHERE tenant = $1 AND actor = $2 AND idempotency_key = $3
          AND state IN ('succeeded', 'failed') AND expires_at <= now()
        RETURNING 1
    )
    SELECT count(*) FROM gone
"""


async def claim(conn: Writer, execution: ExecutionRow, call: CallRow | None = None) -> bool:
    """Claim the key for a first call (and insert ``call``, the new call it executes, in the
    same statement); ``False`` when another request holds it. A finished record past its
    retention gives way."""
    if call is None:
        sql, values = _CLAIM, _EXECUTION.values(execution)
    else:
        sql, values = _CLAIM_WITH_CALL, _EXECUTION.values(execution) + _CALL.values(call)
    if await write_one(conn, sql, *values):
        return True
    key = (execution.tenant, execution.actor, execution.idempotency_key)
    return bool(
        await write_one(conn, _FORGET_EXPIRED, *key) and await write_one(conn, sql, *values)
    )


_FINISH = """
    change AS (
        UPDATE executions
        SET state = $2, provider_status = $3, response = $4, updated_at = now(),
            expires_at = now() + (expires_at - created_at)
        WHERE operation_id = $1 AND state IN ('in_flight', 'unknown') AND state <> $2
        RETURNING call_id
    ),
    moved AS (
        UPDATE calls SET state = $2, updated_at = now() WHERE id IN (SELECT call_id FROM change)
    )
"""


async def finish(
    conn: Writer,
    operation_id: str,
    state: ExecutionState,
    provider_status: int | None,
    response: answers.Execution | None,
    event: AuditEvent | None,
) -> bool:
    """Record an outcome on the execution and its call, with ``event`` when given, in one
    statement; only an open record (in flight or unknown) may change, and a record already
    unknown does not become unknown again (no second audit row). The record's retention
    restarts from its outcome: one resolved after a long unknown would otherwise be forgotten
    at once, and the client's next retry with its key would act a second time."""
    args = (operation_id, state, provider_status, response)
    if event is not None:
        return await append_after(conn, _FINISH, args, event)
    return bool(await write_one(conn, f"WITH {_FINISH} SELECT count(*) FROM change", *args))


async def release(conn: Connection, operation_id: str) -> bool:
    """Forget a claim whose request certainly never reached the provider; whether it was
    still this request's to forget (in flight: not taken over, say, by a worker that found
    its lock lapsed and marked it ``unknown``)."""
    status: str = await conn.execute(
        "DELETE FROM executions WHERE operation_id = $1 AND state = 'in_flight'", operation_id
    )
    return status == "DELETE 1"


async def stale_executions(conn: Connection, older_than_s: float, limit: int) -> list[ExecutionRow]:
    """Open records (in flight or unknown) unchanged for ``older_than_s``, oldest first."""
    rows = await conn.fetch(
        f"""
        SELECT {_EXECUTION_COLUMNS} FROM executions
        WHERE state IN ('in_flight', 'unknown') AND updated_at < now() - make_interval(secs => $1)
        ORDER BY updated_at LIMIT $2
        """,
        older_than_s,
        limit,
    )
    return [ExecutionRow(*r) for r in rows]


async def postpone(conn: Connection, operation_id: str) -> None:
    """Send an open record to the back of the reconciler's queue (its ``updated_at``)."""
    await conn.execute(
        """
        UPDATE executions SET updated_at = now()
        WHERE operation_id = $1 AND state IN ('in_flight', 'unknown')
        """,
        operation_id,
    )


async def purge_expired(conn: Connection, limit: int) -> int:
    """Forget up to ``limit`` finished execution records past their expiry, oldest first."""
    status = await conn.execute(
        """
        DELETE FROM executions WHERE operation_id IN (
            SELECT operation_id FROM executions
            WHERE state IN ('succeeded', 'failed') AND expires_at <= now()
            ORDER BY expires_at LIMIT $1)
        """,
        limit,
    )
    return int(status.split()[-1])


async def remove_before(conn: Connection, before: datetime, limit: int) -> int:
    """Remove up to ``limit`` calls made before ``before``, oldest first, with their
    dry-runs and approvals; a call an execution record still names stays until the record
    expires (it answers replays). The number of calls removed."""
    status = await conn.execute(
        """
        WITH doomed AS (
            SELECT id FROM calls c WHERE created_at < $1
                AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.call_id = c.id)
            ORDER BY created_at LIMIT $2),
        previews AS (DELETE FROM dry_runs WHERE call_id IN (SELECT id FROM doomed)),
        decisions AS (DELETE FROM approvals WHERE call_id IN (SELECT id FROM doomed))
        DELETE FROM calls WHERE id IN (SELECT id FROM doomed)
        """,
        before,
        limit,
    )
    return int(status.split()[-1])


KEPT_DRY_RUNS = 10
"""Previews a call keeps, the newest (and those its approvers decided on: see
``forget_old_dry_runs``): each may be as large as a provider's answer may be, and only the
latest decides anything (approvals bind it, and executions run on it)."""


class DryRuns(NamedTuple):
    rows: list[DryRunRow]
    """The newest ``KEPT_DRY_RUNS``, oldest first; only the newest few with their snapshot."""
    total: int
    """How many the call keeps in all."""


_SHOWN_COLUMNS = ", ".join(
    "CASE WHEN row_number() OVER w <= $3 THEN snapshot END AS snapshot" if c == "snapshot" else c
    for c in DryRunRow._fields
)
"""A preview's columns, its snapshot only among the newest $3 (left unread, TOASTed, else)."""
_DRY_RUNS_OF = f"""
    SELECT * FROM (
        SELECT {_SHOWN_COLUMNS}, count(*) OVER () AS total
        FROM dry_runs WHERE call_id = $1
        WINDOW w AS (ORDER BY created_at DESC, id DESC)
        ORDER BY created_at DESC, id DESC LIMIT $2
    ) d ORDER BY created_at, id
"""


async def dry_runs_of(conn: Connection, call_id: str, snapshots: int) -> DryRuns:
    """The call's newest previews, with the snapshot of only the newest ``snapshots`` of
    them: the others' are not even read (sixty previews of 800 KB once made one history
    answer 45 MB)."""
    found = await conn.fetch(_DRY_RUNS_OF, call_id, KEPT_DRY_RUNS, snapshots)
    width = len(DryRunRow._fields)
    rows = [DryRunRow(*r[:width]) for r in found]
    return DryRuns(rows, found[0]["total"] if found else 0)


async def forget_old_dry_runs(conn: Connection, call_id: str) -> None:
    """Keep the call's newest ``KEPT_DRY_RUNS`` previews, and the newest of each snapshot an
    approver decided on (what they saw stays beside their decision, a few at most: each is
    a person's decision). An older preview named by a request (``dry_run_id``) is refused
    as no such dry-run, as one older than the latest is by an approval's gate."""
    await conn.execute(
        """
        DELETE FROM dry_runs WHERE call_id = $1
          AND id NOT IN (SELECT id FROM dry_runs WHERE call_id = $1
                         ORDER BY created_at DESC, id DESC LIMIT $2)
          AND id NOT IN (SELECT DISTINCT ON (snapshot_hash) id FROM dry_runs
                         WHERE call_id = $1 AND snapshot_hash IN (
                             SELECT snapshot_hash FROM approvals
                             WHERE call_id = $1 AND snapshot_hash IS NOT NULL)
                         ORDER BY snapshot_hash, created_at DESC, id DESC)
        """,
        call_id,
        KEPT_DRY_RUNS,
    )


_EXECUTIONS_OF = (
    f"SELECT {', '.join(ExecutionSummary._fields)} FROM executions"
    " WHERE call_id = $1 ORDER BY created_at, operation_id"
)


async def executions_of(conn: Connection, call_id: str) -> list[ExecutionSummary]:
    """The call's execution records as its history shows them: only the columns it shows,
    so that no provider's answer is read (thirty answers of 800 KB once made a 7 KB
    history cost a read 37 MB)."""
    return [ExecutionSummary(*r) for r in await conn.fetch(_EXECUTIONS_OF, call_id)]


async def standing(
    conn: Connection,
    tenant: str,
    actor: str,
    tool: str,
    fingerprint: str,
    run_id: str | None,
    within_s: float,
) -> CallRow | None:
    """The actor's latest call of exactly this tool and fingerprint, in run ``run_id`` (or
    in none), that waits for an approval or holds one, moved there within ``within_s``
    seconds (the tool's approval lifetime: older ones hold an expired approval or preview).
    A later identical request continues it instead of asking for another approval; one in
    another run is another call, counted against its own run."""
    row = await conn.fetchrow(
        f"""
        SELECT {_CALL_COLUMNS} FROM calls
        WHERE tenant = $1 AND actor = $2 AND fingerprint = $4 AND tool = $3
          AND run_id IS NOT DISTINCT FROM $5
          AND state IN ('awaiting_approval', 'approved')
          AND updated_at > now() - make_interval(secs => $6)
        ORDER BY updated_at DESC LIMIT 1
        """,
        tenant,
        actor,
        tool,
        fingerprint,
        run_id,
        within_s,
    )
    return CallRow(*row) if row else None
