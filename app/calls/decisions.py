"""What every step of a call shares: one request's attempt, its decision, and recording
denials. Every decision, allow or deny, is stored with its audit row in one transaction
before the caller hears the answer; a denied call never reaches the provider."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from app import recordable, telemetry
from app.audit.store import AuditEvent, append
from app.auth.principal import Principal
from app.calls import egress, policy, store
from app.calls.models import CallRow
from app.calls.policy import Decision, Facts, PreparedCall
from app.calls.results import mask_arguments
from app.catalog.models import Catalog, Owner, Tool
from app.db import Connection
from app.errors import DENIALS, NotFound, ToolgateError, UnknownTool
from app.runs import service as runs
from app.state import AppState

PROPOSED_BY = "model"
T = TypeVar("T")


@dataclass
class Attempt:
    """One request's view of a call while it is being decided."""

    principal: Principal
    catalog: Catalog
    tool_name: str
    raw_arguments: Any
    run_id: str | None
    tool_call_id: str | None = None
    started: float = 0.0
    tool: Tool | None = None
    call: PreparedCall | None = None

    def recorded_tool(self) -> str:
        """The tool name as stored: a catalog name, or the requested one in ``recorded``
        form (an unknown tool's name is raw input)."""
        return self.tool.name if self.tool else recordable.text(self.tool_name)

    def authorized_by(self) -> dict[str, Any]:
        return {
            "kind": "policy",
            "sub": self.principal.sub,
            "tenant": self.principal.tenant,
            "policy_version": self.catalog.policy_version,
        }

    def row(
        self,
        call_id: str,
        decision: Decision | None,
        error: ToolgateError | None,
        state: str | None = None,
    ) -> CallRow:
        """The call as stored: ``state`` defaults to ``denied`` or ``proposed``."""
        call, tool = self.call, self.tool
        return CallRow(
            id=call_id,
            tenant=self.principal.tenant,
            actor=self.principal.sub,
            tool=self.recorded_tool(),
            run_id=self.run_id,
            tool_call_id=self.tool_call_id,
            arguments=call.arguments if call else None,
            fingerprint=call.fingerprint if call else None,
            target_type=call.target.type if call and call.target else None,
            target_id=call.target.id if call and call.target else None,
            mutation=tool.mutation if tool else None,
            impact=decision.impact if decision else None,
            decision="deny" if error else "allow",
            code=error.code if error else None,
            reason=error.detail if error else None,
            next=decision.next if decision else None,
            state=state or ("denied" if error else "proposed"),
            policy_version=self.catalog.policy_version,
            proposed_by=PROPOSED_BY,
            authorized_by=None if error else self.authorized_by(),
        )

    def event(self, event: str, call_id: str, **fields: Any) -> AuditEvent:
        call, tool = self.call, self.tool
        arguments = call.arguments if call else recordable.recorded(self.raw_arguments)
        return AuditEvent(
            event=event,
            tenant=self.principal.tenant,
            actor=self.principal.sub,
            call_id=call_id,
            run_id=self.run_id,
            tool=self.recorded_tool(),
            target=call.target.as_dict() if call and call.target else None,
            fingerprint=call.fingerprint if call else None,
            arguments=mask_arguments(arguments, tool.sensitive_args if tool else ()),
            policy_version=self.catalog.policy_version,
            proposed_by=PROPOSED_BY,
            total_ms=(time.perf_counter() - self.started) * 1000,
            **fields,
        )


async def authorize(state: AppState, attempt: Attempt) -> Decision:
    """Schema, identity, roles, then the looked-up facts: the whole decision, or a denial."""
    attempt.tool = attempt.catalog.tools.get(attempt.tool_name)
    if attempt.tool is None:
        raise UnknownTool(f"no tool named {attempt.tool_name!r} in the catalog")
    attempt.call = call = policy.prepare(attempt.tool, attempt.raw_arguments)
    policy.precheck(attempt.principal, call)
    owners = await owners_of(state, call)
    hosts = [policy.egress_host(url) for _, url in call.egress]
    addresses = await concurrently([egress.resolve(h) for h in hosts if h is not None])
    resolved = iter(addresses)
    facts = Facts(
        owners={arg: owner for (arg, _, _), owner in zip(call.resources, owners, strict=True)},
        addresses={
            arg: next(resolved) if host is not None else ()
            for (arg, _), host in zip(call.egress, hosts, strict=True)
        },
    )
    return policy.decide(attempt.principal, call, facts)


async def owners_of(state: AppState, call: PreparedCall) -> list[Owner | None]:
    """Each ``x-resource`` argument's owner, asked of its provider now, concurrently."""
    return await concurrently([state.providers.owner(r, rid) for _, r, rid in call.resources])


async def concurrently(awaitables: list[Awaitable[T]]) -> list[T]:
    """``asyncio.gather``, without its tasks when there is at most one thing to wait for
    (most calls look up one owner and resolve no URL)."""
    if len(awaitables) <= 1:
        return [await awaitable for awaitable in awaitables]
    return list(await asyncio.gather(*awaitables))


async def decide_or_record_denial(
    state: AppState, attempt: Attempt, call_id: str, existing: CallRow | None
) -> Decision:
    """``authorize``, storing any policy denial (call + audit row) before re-raising it."""
    telemetry.bind_call(attempt, call_id)
    try:
        return await authorize(state, attempt)
    except ToolgateError as error:
        if error.code in DENIALS:
            await record_denial(
                state, attempt, call_id, error, new_call=existing is None, deny_call=True
            )
        raise


async def record_denial(
    state: AppState,
    attempt: Attempt,
    call_id: str,
    error: ToolgateError,
    *,
    new_call: bool,
    deny_call: bool,
    event: str = "denied",
) -> None:
    """Store a denial with its audit row; ``deny_call`` also marks an existing call denied."""
    async with writing(state, attempt) as conn:
        await write_denial(
            conn, attempt, call_id, error, new_call=new_call, deny_call=deny_call, event=event
        )


async def write_denial(
    conn: Connection,
    attempt: Attempt,
    call_id: str,
    error: ToolgateError,
    *,
    new_call: bool,
    deny_call: bool,
    event: str = "denied",
) -> None:
    """``record_denial`` inside the caller's transaction. A new denied call still counts
    against its run: a loop of refused calls is a loop too."""
    error.extra["call_id"] = call_id
    audit = attempt.event(event, call_id, decision="deny", code=error.code, reason=error.detail)
    if new_call:
        await store.insert_with_audit(conn, attempt.row(call_id, None, error), audit)
        if attempt.run_id is not None:
            await runs.count_denied(conn, attempt.run_id)
    elif deny_call:
        await store.set_state_with_audit(conn, call_id, "denied", audit)
    else:
        await append(conn, audit)
    telemetry.decided(attempt, call_id, error.code)


async def admit_to_run(
    conn: Connection, attempt: Attempt, *, new_call: bool, cost: float
) -> ToolgateError | None:
    """Count this call (and charge ``cost``) against its run, if it has one; the 429 to
    record and answer otherwise."""
    if attempt.run_id is None:
        return None
    fingerprint = attempt.call.fingerprint if attempt.call else None
    return await runs.admit(
        conn, attempt.principal, attempt.run_id, fingerprint, new_call=new_call, cost=cost
    )


async def record_run_outcome(conn: Connection, attempt: Attempt, status: str, result: Any) -> None:
    if attempt.run_id is not None and attempt.call is not None:
        await runs.record_outcome(conn, attempt.run_id, attempt.call.fingerprint, status, result)


async def refund_run(conn: Connection, attempt: Attempt) -> None:
    """An execution that certainly never ran costs its run nothing."""
    if attempt.run_id is not None and attempt.tool is not None:
        await runs.refund(conn, attempt.run_id, attempt.tool.cost)


def writing(state: AppState, attempt: Attempt) -> AbstractAsyncContextManager[Connection]:
    """Where a call's outcome is written: a transaction when a run's counters must change
    with it, else a plain connection for the single statement that writes call and audit."""
    return state.db.transaction() if attempt.run_id is not None else state.db.connection()


async def check_run(state: AppState, principal: Principal, run_id: str | None) -> None:
    """A ``run_id`` must name the principal's own run before anything is recorded under it."""
    if run_id is not None:
        async with state.db.connection() as conn:
            await runs.visible(conn, principal, run_id)


async def visible_call(state: AppState, principal: Principal, call_id: str) -> CallRow:
    """The actor's own call; any other call is indistinguishable from a missing one."""
    async with state.db.connection() as conn:
        row = await store.get(conn, call_id)
    if row is None or row.tenant != principal.tenant or row.actor != principal.sub:
        raise NotFound("no such call")
    return row
