"""Writing audit rows. Callers pass their open transaction, so a row commits with the state
change it describes or not at all."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from app.db import Connection, Record


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


_COLUMNS = [f.name for f in fields(AuditEvent)]
_INSERT = (
    f"INSERT INTO audit_events ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(_COLUMNS) + 1))})"
)


async def append(conn: Connection, event: AuditEvent) -> None:
    await conn.execute(_INSERT, *(getattr(event, name) for name in _COLUMNS))


async def of_call(conn: Connection, call_id: str) -> list[Record]:
    """One call's audit rows, oldest first (GET /calls/{id})."""
    return list(
        await conn.fetch("SELECT * FROM audit_events WHERE call_id = $1 ORDER BY seq", call_id)
    )
