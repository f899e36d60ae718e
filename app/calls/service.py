"""Use cases for tool calls: gather facts, ask the pure policy, record, forward.

Every decision, allow or deny, is stored as a call with its audit row in one transaction
before the caller hears the answer. A denied call never reaches the provider.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from app.audit.store import AuditEvent, append
from app.auth.principal import Principal
from app.calls import egress, policy, store
from app.calls.models import CallRow, ExecuteBody, ProposeBody
from app.calls.policy import Decision, Facts, PreparedCall
from app.calls.results import mask_arguments, minimize
from app.catalog.models import Catalog, Tool
from app.errors import (
    DENIALS,
    InvalidRequest,
    NotFound,
    ProviderTimeout,
    ProviderUnavailable,
    ToolgateError,
    UnknownTool,
)
from app.outbound import NotSent, Uncertain
from app.state import AppState

PROPOSED_BY = "model"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


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

    def authorized_by(self) -> dict[str, Any]:
        return {
            "kind": "policy",
            "sub": self.principal.sub,
            "tenant": self.principal.tenant,
            "policy_version": self.catalog.policy_version,
        }

    def row(self, call_id: str, decision: Decision | None, error: ToolgateError | None) -> CallRow:
        call, tool = self.call, self.tool
        return CallRow(
            id=call_id,
            tenant=self.principal.tenant,
            actor=self.principal.sub,
            tool=self.tool_name,
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
            state="denied" if error else "proposed",
            policy_version=self.catalog.policy_version,
            proposed_by=PROPOSED_BY,
            authorized_by=None if error else self.authorized_by(),
        )

    def event(self, event: str, call_id: str, **fields: Any) -> AuditEvent:
        call, tool = self.call, self.tool
        arguments = call.arguments if call else self.raw_arguments
        return AuditEvent(
            event=event,
            tenant=self.principal.tenant,
            actor=self.principal.sub,
            call_id=call_id,
            run_id=self.run_id,
            tool=self.tool_name,
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
    owners = await asyncio.gather(*(state.gateway.owner(r, rid) for _, r, rid in call.resources))
    hosts = [policy.egress_host(url) for _, url in call.egress]
    addresses = await asyncio.gather(*(egress.resolve(h) for h in hosts if h is not None))
    resolved = iter(addresses)
    facts = Facts(
        owners={arg: owner for (arg, _, _), owner in zip(call.resources, owners, strict=True)},
        addresses={
            arg: next(resolved) if host is not None else ()
            for (arg, _), host in zip(call.egress, hosts, strict=True)
        },
    )
    return policy.decide(attempt.principal, call, facts)


async def decide_or_record_denial(
    state: AppState, attempt: Attempt, call_id: str, existing: CallRow | None
) -> Decision:
    """``authorize``, storing any policy denial (call + audit row) before re-raising it."""
    try:
        return await authorize(state, attempt)
    except ToolgateError as error:
        if error.code not in DENIALS:
            raise
        error.extra["call_id"] = call_id
        async with state.db.transaction() as conn:
            if existing is None:
                await store.insert(conn, attempt.row(call_id, None, error))
            else:
                await store.set_state(conn, call_id, "denied")
            await append(
                conn,
                attempt.event(
                    "denied", call_id, decision="deny", code=error.code, reason=error.detail
                ),
            )
        raise


async def propose(state: AppState, principal: Principal, body: ProposeBody) -> dict[str, Any]:
    attempt = Attempt(
        principal=principal,
        catalog=state.catalog,
        tool_name=body.tool,
        raw_arguments=body.arguments,
        run_id=body.run_id,
        tool_call_id=body.tool_call_id,
        started=time.perf_counter(),
    )
    call_id = new_id("call")
    decision = await decide_or_record_denial(state, attempt, call_id, None)
    row = attempt.row(call_id, decision, None)
    async with state.db.transaction() as conn:
        await store.insert(conn, row)
        await append(
            conn,
            attempt.event(
                "proposed",
                call_id,
                decision="allow",
                reason=f"next: {decision.next}",
                authorized_by=row.authorized_by,
            ),
        )
    return {
        "call_id": call_id,
        "tool": row.tool,
        "decision": "allow",
        "mutation": row.mutation,
        "impact": decision.impact,
        "next": decision.next,
        "arguments": row.arguments,
        "fingerprint": row.fingerprint,
        "target": row.target,
        "policy_version": row.policy_version,
        "proposed_by": PROPOSED_BY,
        "authorized_by": row.authorized_by,
    }


async def visible_call(state: AppState, principal: Principal, call_id: str) -> CallRow:
    """The actor's own call; any other call is indistinguishable from a missing one."""
    async with state.db.connection() as conn:
        row = await store.get(conn, call_id)
    if row is None or row.tenant != principal.tenant or row.actor != principal.sub:
        raise NotFound("no such call")
    return row


async def execute(state: AppState, principal: Principal, body: ExecuteBody) -> dict[str, Any]:
    """Run a read tool now, re-authorized from scratch. (Mutations: see the mutation path.)"""
    attempt = Attempt(
        principal=principal,
        catalog=state.catalog,
        tool_name=body.tool,
        raw_arguments=body.arguments,
        run_id=body.run_id,
        started=time.perf_counter(),
    )
    existing = await visible_call(state, principal, body.call_id) if body.call_id else None
    call_id = existing.id if existing else new_id("call")
    decision = await decide_or_record_denial(state, attempt, call_id, existing)
    call, tool = attempt.call, attempt.tool
    assert call is not None
    assert tool is not None
    if existing is not None and (
        existing.tool != tool.name or existing.fingerprint != call.fingerprint
    ):
        raise InvalidRequest("call_id names a call with another tool, target or arguments")
    if tool.mutation:
        raise InvalidRequest("mutations are not available yet")  # replaced by the mutation path
    try:
        response = await state.gateway.call(
            tool.provider, tool.execute, call.arguments, principal, call_id
        )
    except (NotSent, Uncertain) as exc:
        await _record_outcome(state, attempt, decision, existing, call_id, "failed", None, None)
        if isinstance(exc, NotSent):
            raise ProviderUnavailable("the provider could not be reached", call_id=call_id) from exc
        raise ProviderTimeout(
            "the provider did not answer in time", call_id=call_id, status="unknown"
        ) from exc
    if response.status >= 500 or response.status < 200 or 300 <= response.status < 400:
        await _record_outcome(
            state,
            attempt,
            decision,
            existing,
            call_id,
            "failed",
            response.status,
            response.elapsed_ms,
        )
        raise ProviderTimeout(
            "the provider did not give a usable answer", call_id=call_id, status="unknown"
        )
    status = "succeeded" if response.status < 300 else "failed"
    await _record_outcome(
        state, attempt, decision, existing, call_id, status, response.status, response.elapsed_ms
    )
    return {
        "call_id": call_id,
        "operation_id": None,
        "status": status,
        "provider_status": response.status,
        "result": minimize(response.body, tool.result.fields, tool.result.redact),
        "trust": "untrusted",
        "replayed": False,
    }


async def _record_outcome(
    state: AppState,
    attempt: Attempt,
    decision: Decision,
    existing: CallRow | None,
    call_id: str,
    status: str,
    provider_status: int | None,
    provider_ms: float | None,
) -> None:
    row = replace(attempt.row(call_id, decision, None), state=status)
    async with state.db.transaction() as conn:
        if existing is None:
            await store.insert(conn, row)
        else:
            await store.set_state(conn, call_id, status)
        await append(
            conn,
            attempt.event(
                "executed" if status == "succeeded" else "failed",
                call_id,
                decision="allow",
                authorized_by=row.authorized_by,
                outcome={"status": status, "provider_status": provider_status},
                provider_ms=provider_ms,
            ),
        )
