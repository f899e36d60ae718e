"""Known values, as admins manage them (``/known-values``) and approvers add them
(``remember`` on ``POST /approve``): tenant-scoped, audited, never from a model's call."""

from __future__ import annotations

from app import cursors
from app.audit.store import AuditEvent, append
from app.auth.principal import Principal
from app.catalog.models import Catalog
from app.db import Connection, Database
from app.errors import Forbidden, InvalidRequest, NotFound
from app.known import store
from app.known.models import Forgotten, KnownPage, KnownValue
from app.runs import endorsement

PAGE_SIZE = 100


def sensitive_kind(catalog: Catalog, kind: str) -> bool:
    """Whether some tool's sensitive argument is endorsed by values of ``kind``: such values
    are kept as their digest only, never shown."""
    return any(
        arg.kind == kind and arg.argument in tool.sensitive_args
        for tool in catalog.tools.values()
        for arg in tool.endorsed_args
    )


async def remember(
    conn: Connection,
    catalog: Catalog,
    tenant: str,
    kind: str,
    value: str,
    by: str,
    *,
    sensitive: bool,
) -> str:
    """Add ``value`` to the tenant's known values of ``kind``, with its audit row, in the
    caller's transaction; its digest."""
    digest = endorsement.digest(kind, value)
    shown = None if sensitive or sensitive_kind(catalog, kind) else value
    if await store.add(conn, tenant, kind, digest, shown, by):
        await append(conn, _event("remembered", tenant, by, kind, digest))
    return digest


def _event(event: str, tenant: str, actor: str, kind: str, digest: str) -> AuditEvent:
    """A known value's audit row: its kind and digest, never the value."""
    return AuditEvent(
        event=event,
        tenant=tenant,
        actor=actor,
        decision="allow",
        outcome={"kind": kind, "digest": digest},
    )


def _admin(admin_role: str, principal: Principal) -> None:
    if admin_role not in principal.roles:
        raise Forbidden("only an admin manages known values")


def _value(value: str) -> str:
    if not value.strip() or len(value) > 1000 or not value.isprintable():
        raise InvalidRequest("a known value is 1 to 1000 printable characters")
    return value


async def put(
    db: Database, catalog: Catalog, admin_role: str, principal: Principal, kind: str, value: str
) -> KnownValue:
    _admin(admin_role, principal)
    async with db.transaction() as conn:
        digest = await remember(
            conn,
            catalog,
            principal.tenant,
            kind,
            _value(value),
            principal.sub,
            sensitive=False,
        )
    shown = None if sensitive_kind(catalog, kind) else value
    return {"kind": kind, "digest": digest, "value": shown}


async def delete(
    db: Database, admin_role: str, principal: Principal, kind: str, value: str
) -> Forgotten:
    _admin(admin_role, principal)
    digest = endorsement.digest(kind, _value(value))
    async with db.transaction() as conn:
        if not await store.remove(conn, principal.tenant, kind, digest):
            raise NotFound("no such known value")
        await append(conn, _event("forgotten", principal.tenant, principal.sub, kind, digest))
    return {"kind": kind, "digest": digest, "removed": True}


async def listing(
    db: Database, admin_role: str, principal: Principal, kind: str, cursor: str | None
) -> KnownPage:
    _admin(admin_role, principal)
    after = cursors.decode(cursor, 1)[0] if cursor is not None else None
    async with db.connection() as conn:
        rows = await store.page(conn, principal.tenant, kind, after, PAGE_SIZE + 1)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    return {
        "items": [
            {
                "kind": r.kind,
                "digest": r.digest,
                "value": r.value,
                "added_by": r.added_by,
                "added_at": r.added_at.isoformat(),
            }
            for r in rows
        ],
        "next_cursor": cursors.encode(rows[-1].digest) if more else None,
    }
