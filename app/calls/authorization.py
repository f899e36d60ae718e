"""Authorizing a request: schema, identity and roles, then the facts looked up just now
(resource owners, egress addresses), then ``policy.decide``. The result is a frozen
``Authorized`` the rest of the path takes; a denial is stored (call + audit row) and raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Literal, TypeVar

from app import telemetry
from app.auth.principal import Principal
from app.calls import egress, policy, store
from app.calls.models import Authorized, CallRow, Request
from app.calls.policy import Facts, PreparedCall
from app.calls.recording import record_refusal
from app.calls.services import Services
from app.catalog.models import Owner
from app.consent import store as approvals
from app.db import Database
from app.errors import NotFound, ToolgateError, UnknownTool
from app.known import digests
from app.known import store as known_values
from app.providers import ProviderClient
from app.runs import endorsement
from app.runs import service as runs
from app.runs.endorsement import TrustedTexts
from app.runs.models import RunRow
from app.runs.provenance import Recall

T = TypeVar("T")


async def authorize(
    state: Services,
    request: Request,
    call_id: str,
    existing: CallRow | None,
    *,
    own_arguments: bool = True,
) -> Authorized:
    """The whole decision on ``request``, recorded as the call ``call_id`` if it is a
    denial: a new call unless ``existing``. An existing call is marked denied only when the
    request decided on its own stored arguments (``own_arguments``): a client that sends
    other, invalid arguments for it is refused and audited, but cannot spoil the call."""
    telemetry.bind_call(request, call_id)
    call: PreparedCall | None = None
    try:
        if request.tool is None:
            raise UnknownTool(f"no tool named {request.tool_name!r} in the catalog")
        call = policy.prepare(
            request.tool, policy.completed(request.tool, request.principal, request.raw_arguments)
        )
        policy.precheck(request.principal, call)
        facts = await facts_of(state, call, request)
        decision = policy.decide(request.principal, call, facts)
    except ToolgateError as error:  # a policy denial: authorization raises no gate's refusal
        if request.run_unread:
            # Recorded only under the principal's own run. Decided without the run's scope,
            # which ``decide`` judges last: on the run, the same refusal.
            request = await with_run(state.db, request)
        await record_refusal(
            state.db,
            request,
            call,
            call_id,
            error,
            new_call=existing is None,
            deny_call=own_arguments,
        )
        raise
    authorized = Authorized(request, call, decision, facts)
    if request.run_unread and decision.impact == "high":  # its approval is asked on its run
        return await on_its_run(state.db, authorized, call_id, existing is None)
    return authorized


async def on_its_run(
    db: Database, authorized: Authorized, call_id: str, new_call: bool
) -> Authorized:
    """``authorized``, decided before its run was read (``Request.run_unread``), decided
    again on the run read now, with the same facts and the run's scope; a refusal recorded
    (only under the principal's own run: another's is ``NotFound``, and nothing is)."""
    request = await with_run(db, authorized.request)
    facts = authorized.facts._replace(scope=scope_of(request.run))
    try:
        decision = policy.decide(request.principal, authorized.call, facts)
    except ToolgateError as error:
        await record_refusal(
            db, request, authorized.call, call_id, error, new_call=new_call, deny_call=True
        )
        raise
    return Authorized(request, authorized.call, decision, facts)


async def facts_of(state: Services, call: PreparedCall, request: Request) -> Facts:
    run_id = request.run_id
    owners = await owners_of(state.providers, call)
    hosts = [policy.egress_host(url) for _, url in call.egress]
    addresses = iter(await concurrently([egress.resolve(h) for h in hosts if h is not None]))
    return Facts(
        owners={arg: owner for (arg, _, _), owner in zip(call.resources, owners, strict=True)},
        addresses={
            arg: next(addresses) if host is not None else ()
            for (arg, _), host in zip(call.egress, hosts, strict=True)
        },
        recall=await recall_of(state.db, call, run_id),
        sources=await sources_of(
            state.db, state.trusted, state.settings.known_values_keys, call, request
        ),
        scope=scope_of(request.run),
    )


def scope_of(run: RunRow | None) -> policy.Scope | None:
    if run is None or run.scope_tools is None:
        return None
    outside: Literal["deny", "approve"] = "approve" if run.scope_outside == "approve" else "deny"
    return policy.Scope(frozenset(run.scope_tools), outside)


async def sources_of(
    db: Database,
    trusted_texts: TrustedTexts,
    keys: tuple[bytes, ...],
    call: PreparedCall,
    request: Request,
) -> endorsement.Sources | None:
    """What can endorse the call's ``x-endorsed`` arguments: its run's task and the trusted
    results the run was given (held by this process while they stay the same), and which of
    its values are known values of the tenant, or the caller's own (one statement, by their
    digests under ``keys``: none, and known values endorse nothing). Nothing to ask for a
    tool without such arguments. A database that cannot answer fails the request (503),
    never endorses."""
    endorsed = call.tool.endorsed_args
    if not endorsed:
        return None
    run = request.run
    task = None
    if run is not None and run.task:
        task = endorsement.Text.stored(run.task_form or endorsement.formed([run.task]))
    candidates = endorsement.candidates(endorsed, call.arguments)
    if not candidates:
        return endorsement.Sources(task, (), frozenset())
    keyed = [digests.lookups(keys, k, v) for k, v in candidates]
    held = trusted_texts.get(run.id) if run is not None else None
    principal = request.principal
    async with db.connection() as conn:
        chars, stored, found = await known_values.sources(
            conn,
            principal.tenant,
            principal.sub,
            request.run_id,
            [d for ds in keyed for d in ds],
            held[0] if held else -1,
        )
    known = frozenset(
        candidate for candidate, ds in zip(candidates, keyed, strict=True) if found & set(ds)
    )
    trusted = held[1] if held else ()  # unless the run keeps more than this process holds
    if stored is not None and run is not None:
        trusted = trusted_texts.put(run.id, chars, stored)
    return endorsement.Sources(task, trusted, known)


async def recall_of(db: Database, call: PreparedCall, run_id: str | None) -> Recall | None:
    """What the call's run remembers of its arguments; nothing to ask outside a run, for a
    tool that allows tainted arguments, or without an argument long enough to judge. A
    database that cannot answer fails the request (503), never passes it as untainted."""
    candidates = policy.taint_candidates(call) if run_id is not None else []
    if not candidates:
        return None
    assert run_id is not None
    async with db.connection() as conn:
        return await runs.recall(conn, run_id, candidates)


async def owners_of(providers: ProviderClient, call: PreparedCall) -> list[Owner | None]:
    """Each ``x-resource`` argument's owner, asked of its provider now, concurrently."""
    return await concurrently([providers.owner(r, rid) for _, r, rid in call.resources])


async def concurrently(awaitables: list[Awaitable[T]]) -> list[T]:
    """``asyncio.gather``, without its tasks when there is at most one thing to wait for
    (most calls look up one owner and resolve no URL)."""
    if len(awaitables) <= 1:
        return [await awaitable for awaitable in awaitables]
    return list(await asyncio.gather(*awaitables))


async def with_run(db: Database, request: Request) -> Request:
    """``request`` with the run it names, read now. A ``run_id`` must name the principal's
    own run before anything is recorded under it (else ``NotFound``); the run's scope and
    task decide too."""
    if request.run_id is None:
        return request
    async with db.connection() as conn:
        run = await runs.visible(conn, request.principal, request.run_id)
    return request._replace(run=run)


async def visible_call(db: Database, principal: Principal, call_id: str) -> CallRow:
    """The actor's own call; any other call is indistinguishable from a missing one."""
    async with db.connection() as conn:
        row = await store.get(conn, call_id)
    if row is None or row.tenant != principal.tenant or row.actor != principal.sub:
        raise NotFound("no such call")
    return row


async def approved_call(
    db: Database, principal: Principal, approval_id: str | None
) -> CallRow | None:
    """The actor's own call that ``approval_id`` was given for, or ``None`` (no approval
    named, or none of the actor's: it is refused where approvals are checked). An
    execution by approval alone runs that call, so it counts against that call's run."""
    if approval_id is None:
        return None
    async with db.connection() as conn:
        approval = await approvals.get(conn, approval_id)
        row = await store.get(conn, approval.call_id) if approval else None
    if row is None or row.tenant != principal.tenant or row.actor != principal.sub:
        return None
    return row
