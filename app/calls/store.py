"""SQL for calls, dry-runs and execution records. Functions take the caller's connection;
the use case owns the transaction."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from app.calls.models import CallRow, DryRunRow, ExecutionRow
from app.db import Connection

_GENERATED = {"created_at", "updated_at"}


def _insert_sql(table: str, row_type: type) -> tuple[str, list[str]]:
    columns = [f.name for f in fields(row_type) if f.name not in _GENERATED]
    placeholders = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders})", columns


_CALL_INSERT, _CALL_COLUMNS = _insert_sql("calls", CallRow)
_DRY_RUN_INSERT, _DRY_RUN_COLUMNS = _insert_sql("dry_runs", DryRunRow)
_CLAIM, _EXECUTION_COLUMNS = _insert_sql("executions", ExecutionRow)


def _values(row: Any, columns: list[str]) -> list[Any]:
    return [getattr(row, name) for name in columns]


async def insert(conn: Connection, call: CallRow) -> None:
    await conn.execute(_CALL_INSERT, *_values(call, _CALL_COLUMNS))


async def get(conn: Connection, call_id: str) -> CallRow | None:
    row = await conn.fetchrow("SELECT * FROM calls WHERE id = $1", call_id)
    return CallRow(**dict(row)) if row else None


async def set_state(conn: Connection, call_id: str, state: str) -> None:
    await conn.execute(
        "UPDATE calls SET state = $2, updated_at = now() WHERE id = $1", call_id, state
    )


async def insert_dry_run(conn: Connection, dry_run: DryRunRow) -> None:
    await conn.execute(_DRY_RUN_INSERT, *_values(dry_run, _DRY_RUN_COLUMNS))


async def latest_dry_run(conn: Connection, call_id: str) -> DryRunRow | None:
    row = await conn.fetchrow(
        "SELECT * FROM dry_runs WHERE call_id = $1 ORDER BY created_at DESC, id LIMIT 1", call_id
    )
    return DryRunRow(**dict(row)) if row else None


async def dry_run_for(
    conn: Connection, tenant: str, actor: str, fingerprint: str, dry_run_id: str | None
) -> DryRunRow | None:
    """The named dry-run, or the latest one, of this actor's call with this fingerprint."""
    row = await conn.fetchrow(
        """
        SELECT * FROM dry_runs
        WHERE tenant = $1 AND actor = $2 AND fingerprint = $3 AND ($4::text IS NULL OR id = $4)
        ORDER BY created_at DESC, id LIMIT 1
        """,
        tenant,
        actor,
        fingerprint,
        dry_run_id,
    )
    return DryRunRow(**dict(row)) if row else None


async def get_execution(conn: Connection, tenant: str, actor: str, key: str) -> ExecutionRow | None:
    """The live record for this key; finished records past their retention do not count."""
    row = await conn.fetchrow(
        """
        SELECT * FROM executions
        WHERE tenant = $1 AND actor = $2 AND idempotency_key = $3
          AND NOT (state IN ('succeeded', 'failed') AND expires_at <= now())
        """,
        tenant,
        actor,
        key,
    )
    return ExecutionRow(**dict(row)) if row else None


async def claim(conn: Connection, execution: ExecutionRow) -> bool:
    """Claim the key for a first call; ``False`` when another request holds it."""
    await conn.execute(
        """
        DELETE FROM executions
        WHERE tenant = $1 AND actor = $2 AND idempotency_key = $3
          AND state IN ('succeeded', 'failed') AND expires_at <= now()
        """,
        execution.tenant,
        execution.actor,
        execution.idempotency_key,
    )
    status = await conn.execute(
        _CLAIM + " ON CONFLICT (tenant, actor, idempotency_key) DO NOTHING",
        *_values(execution, _EXECUTION_COLUMNS),
    )
    return bool(status.endswith(" 1"))


async def finish(
    conn: Connection,
    operation_id: str,
    state: str,
    provider_status: int | None,
    response: dict[str, Any] | None,
) -> bool:
    """Record an outcome; only an open record (in flight or unknown) may change."""
    status = await conn.execute(
        """
        UPDATE executions
        SET state = $2, provider_status = $3, response = $4, updated_at = now()
        WHERE operation_id = $1 AND state IN ('in_flight', 'unknown')
        """,
        operation_id,
        state,
        provider_status,
        response,
    )
    return bool(status.endswith(" 1"))


async def release(conn: Connection, operation_id: str) -> None:
    """Forget a claim whose request certainly never reached the provider."""
    await conn.execute(
        "DELETE FROM executions WHERE operation_id = $1 AND state = 'in_flight'", operation_id
    )


async def purge_expired(conn: Connection) -> int:
    status = await conn.execute(
        "DELETE FROM executions WHERE state IN ('succeeded', 'failed') AND expires_at <= now()"
    )
    return int(status.split()[-1])


async def dry_runs_of(conn: Connection, call_id: str) -> list[DryRunRow]:
    rows = await conn.fetch(
        "SELECT * FROM dry_runs WHERE call_id = $1 ORDER BY created_at, id", call_id
    )
    return [DryRunRow(**dict(r)) for r in rows]


async def executions_of(conn: Connection, call_id: str) -> list[ExecutionRow]:
    rows = await conn.fetch(
        "SELECT * FROM executions WHERE call_id = $1 ORDER BY created_at, operation_id", call_id
    )
    return [ExecutionRow(**dict(r)) for r in rows]
