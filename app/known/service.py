"""Known values, as admins manage them (``/known-values``) and approvers add them
(``remember`` on ``POST /approve``): tenant-scoped, audited, never from a model's call.

Who may vouch, and for whom: an admin vouches for the tenant; a call's approvers vouch
only together (every approver of its quorum asked to remember the argument), for the
tenant, unless one of them is the call's own actor, who vouches only for their own later
calls (scope ``user``). What approvers vouched for endorses while their approvals could
still run the call, and for good once it starts (``migrations/0021``); a rejection
withdraws it. Values are kept by keyed digest (``digests``), and a sensitive one by its
digest alone."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from app import cursors
from app.audit.store import AuditEvent, append
from app.auth.principal import Principal
from app.catalog.models import Catalog
from app.db import Connection, Database
from app.errors import Forbidden, InvalidRequest, NotFound
from app.known import digests, store
from app.known.models import Forgotten, KnownItem, KnownPage, KnownValue
from app.known.store import KnownRow
from app.runs.comparison import form

PAGE_SIZE = 100
SYSTEM = "toolgate"
"""The actor of what toolgate itself does to known values (a retired key's)."""


def keyed(keys: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """``keys`` (``Settings.known_values_keys``), or refused: without a key, no value can be
    vouched for, looked up or removed (known values are off)."""
    if not keys:
        raise InvalidRequest("known values are off: this toolgate has no TOOLGATE_KNOWN_VALUES_KEY")
    return keys


def sensitive_kind(catalog: Catalog, kind: str) -> bool:
    """Whether some tool's sensitive argument is endorsed by values of ``kind``: such values
    are kept as their digest only, never shown."""
    return any(
        arg.kind == kind and arg.argument in tool.sensitive_args
        for tool in catalog.tools.values()
        for arg in tool.endorsed_args
    )


class Vouch(NamedTuple):
    """Who vouches for values, and for whom."""

    tenant: str
    by: str
    """Who added them: the admin, or the approver whose approval completed the quorum."""
    user: str | None = None
    """Scope ``user``: they endorse only this user's calls; ``None``: the tenant's."""
    call_id: str | None = None
    """The call whose approvals vouch; ``None``: an admin."""
    until: datetime | None = None
    """When the call's approvals lapse (its values with them, unless it has started)."""
    approvers: tuple[str, ...] = ()
    """The approvers of the quorum, for the audit trail."""


async def remember(
    conn: Connection,
    keys: tuple[bytes, ...],
    catalog: Catalog,
    vouch: Vouch,
    values: Iterable[tuple[str, str]],
) -> list[str]:
    """Add each ``(kind, value)`` as ``vouch`` says, with its audit row, in the caller's
    transaction; their digests. A value is kept in the form it is compared in (unless it
    is sensitive: then only its digest)."""
    key = keyed(keys)[0]
    found = []
    for kind, value in values:
        shown = None if sensitive_kind(catalog, kind) else form(value)
        row = KnownRow(
            vouch.tenant,
            kind,
            digests.digest(key, kind, value),
            shown,
            vouch.by,
            vouch.user,
            vouch.call_id,
            vouch.until,
        )
        if await store.add(conn, row):
            await append(conn, _event("remembered", vouch.by, row, vouch.approvers))
        found.append(row.digest)
    return found


async def withdraw(conn: Connection, tenant: str, call_id: str, by: str) -> None:
    """Take back what the call's approvals vouched for: it was rejected before it ran."""
    for row in await store.withdraw(conn, call_id):
        await append(conn, _event("withdrawn", by, row))


def _event(event: str, actor: str, row: KnownRow, approvers: tuple[str, ...] = ()) -> AuditEvent:
    """A known value's audit row: its kind, keyed digest and scope, never the value, nor a
    plain hash of it (an older version's digest, removed by ``rekey``, is left out)."""
    digest = row.digest if row.digest.startswith(digests.PREFIX) else None
    outcome: dict[str, object] = {"kind": row.kind, "digest": digest, **_scope(row)}
    if approvers:
        outcome["approvers"] = list(approvers)
    return AuditEvent(
        event=event,
        tenant=row.tenant,
        actor=actor,
        call_id=row.call_id,
        decision="allow",
        outcome=outcome,
    )


def _scope(row: KnownRow) -> dict[str, str]:
    return {"scope": "tenant"} if row.user_sub is None else {"scope": "user", "user": row.user_sub}


def _admin(admin_role: str, principal: Principal) -> None:
    if admin_role not in principal.roles:
        raise Forbidden("only an admin manages known values")


def _value(value: str) -> str:
    if not value.strip() or len(value) > 1000 or not value.isprintable():
        raise InvalidRequest("a known value is 1 to 1000 printable characters")
    return value


async def put(
    db: Database,
    keys: tuple[bytes, ...],
    catalog: Catalog,
    admin_role: str,
    principal: Principal,
    kind: str,
    value: str,
) -> KnownValue:
    """An admin vouches for ``value`` for their whole tenant."""
    _admin(admin_role, principal)
    async with db.transaction() as conn:
        [digest] = await remember(
            conn, keys, catalog, Vouch(principal.tenant, principal.sub), [(kind, _value(value))]
        )
    shown = None if sensitive_kind(catalog, kind) else form(value)
    return {"kind": kind, "digest": digest, "value": shown}


async def delete(
    db: Database,
    keys: tuple[bytes, ...],
    admin_role: str,
    principal: Principal,
    kind: str,
    value: str,
) -> Forgotten:
    """An admin removes ``value`` in every scope (the tenant's, and any user's own)."""
    _admin(admin_role, principal)
    found = digests.lookups(keyed(keys), kind, _value(value))
    async with db.transaction() as conn:
        removed = await store.remove(conn, principal.tenant, kind, list(found))
        if not removed:
            raise NotFound("no such known value")
        for row in removed:
            await append(conn, _event("forgotten", principal.sub, row))
    return {"kind": kind, "digest": found[0], "removed": True}


async def listing(
    db: Database, admin_role: str, principal: Principal, kind: str, cursor: str | None
) -> KnownPage:
    """The values of ``kind`` that endorse now, each with its scope and who added it."""
    _admin(admin_role, principal)
    after = None
    if cursor is not None:
        digest, place = cursors.decode(cursor, 2)
        after = (digest, place.removeprefix("m"))
    async with db.connection() as conn:
        rows = await store.page(conn, principal.tenant, kind, after, PAGE_SIZE + 1)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    last = rows[-1] if more else None
    return {
        "items": [_item(row) for row, _ in rows],
        "next_cursor": cursors.encode(last[0].digest, "m" + last[1]) if last else None,
    }


def _item(row: KnownRow) -> KnownItem:
    assert row.added_at is not None  # a stored row's
    return {
        "kind": row.kind,
        "digest": row.digest,
        "value": row.value,
        "scope": "tenant" if row.user_sub is None else "user",
        "user": row.user_sub,
        "added_by": row.added_by,
        "added_at": row.added_at.isoformat(),
        "call_id": row.call_id,
        "until": row.until.isoformat() if row.until else None,
    }


class Rekeyed(NamedTuple):
    redigested: int
    """Values kept in plain form, digested again under the current key."""
    kept: int
    """Sensitive values under the previous key, still endorsing until entered again."""
    removed: list[KnownRow]
    """Sensitive values under no configured key: nobody can digest them again."""


async def rekey(db: Database, keys: tuple[bytes, ...]) -> Rekeyed:
    """Bring every known value under the current key (``toolgate migrate``, after a key is
    first set or rotated, and after the plain digests of older versions).

    A value kept in plain form is digested again. A sensitive one cannot be (only its
    digest was kept): under the previous key it still endorses, until an admin or approver
    enters it again and the previous key is retired; under no configured key (a retired
    key's, or an older version's plain hash) it can never match again and is removed,
    audited as ``withdrawn``, and told, so that an admin can enter it again."""
    current = digests.under(keyed(keys)[0])
    previous = digests.under(keys[1]) if len(keys) > 1 else None
    redigested, kept, removed = 0, 0, []
    async with db.transaction() as conn:
        for row in await store.not_under(conn, current):
            if row.value is not None:
                await store.redigest(conn, row, digests.digest(keys[0], row.kind, row.value))
                redigested += 1
            elif previous is not None and row.digest.startswith(previous):
                kept += 1
            else:
                await store.drop(conn, row)
                await append(conn, _event("withdrawn", SYSTEM, row))
                removed.append(row)
    return Rekeyed(redigested, kept, removed)
