"""SQL for calls. Functions take the caller's connection; the use case owns the transaction."""

from __future__ import annotations

from dataclasses import fields

from app.calls.models import CallRow
from app.db import Connection

_WRITTEN = [f.name for f in fields(CallRow) if f.name not in ("created_at", "updated_at")]
_INSERT = (
    f"INSERT INTO calls ({', '.join(_WRITTEN)}) "
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(_WRITTEN) + 1))})"
)


async def insert(conn: Connection, call: CallRow) -> None:
    await conn.execute(_INSERT, *(getattr(call, name) for name in _WRITTEN))


async def get(conn: Connection, call_id: str) -> CallRow | None:
    row = await conn.fetchrow("SELECT * FROM calls WHERE id = $1", call_id)
    return CallRow(**dict(row)) if row else None


async def set_state(conn: Connection, call_id: str, state: str) -> None:
    await conn.execute(
        "UPDATE calls SET state = $2, updated_at = now() WHERE id = $1", call_id, state
    )
