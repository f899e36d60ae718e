"""Use cases for tool calls: propose, dry-run, and execute (reads here, mutations in
``mutation``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from app import telemetry
from app.audit.store import append
from app.auth.principal import Principal
from app.calls import mutation, store
from app.calls.decisions import (
    PROPOSED_BY,
    Attempt,
    admit_to_run,
    check_run,
    decide_or_record_denial,
    record_run_outcome,
    visible_call,
    write_denial,
    writing,
)
from app.calls.models import (
    SETTLED,
    CallRow,
    DryRunBody,
    DryRunRow,
    ExecuteBody,
    ProposeBody,
)
from app.calls.policy import Decision
from app.calls.results import classify, result_body
from app.canonical import digest
from app.errors import InvalidRequest, ProviderTimeout, ProviderUnavailable
from app.ids import new_id
from app.outbound import NotSent, TooLarge, Uncertain
from app.state import AppState

DRY_RUN_TTL_S = 300
TOO_LARGE = "the provider's response is too large"


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
    await check_run(state, principal, body.run_id)
    call_id = new_id("call")
    decision = await decide_or_record_denial(state, attempt, call_id, None)
    row = attempt.row(call_id, decision, None)
    if decision.next == "approval":
        row = replace(row, state="awaiting_approval")
    event = attempt.event(
        "proposed",
        call_id,
        decision="allow",
        reason=f"next: {decision.next}",
        authorized_by=row.authorized_by,
    )
    async with writing(state, attempt) as conn:
        refusal = await admit_to_run(conn, attempt, new_call=True, cost=0.0)
        if refusal is not None:
            await write_denial(conn, attempt, call_id, refusal, new_call=True, deny_call=False)
        else:
            await store.insert_with_audit(conn, row, event)
    if refusal is not None:
        raise refusal
    telemetry.decided(attempt, call_id)
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


@dataclass(frozen=True)
class Outcome:
    """An execute answer: the body, plus headers such as ``Idempotent-Replayed``."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


async def execute(
    state: AppState, principal: Principal, body: ExecuteBody, idempotency_key: str | None
) -> Outcome:
    """Run a call now, re-authorized from scratch: reads here, mutations exactly once."""
    existing = await visible_call(state, principal, body.call_id) if body.call_id else None
    if existing is not None and body.run_id not in (None, existing.run_id):
        raise InvalidRequest("run_id differs from the run of call_id")
    attempt = Attempt(
        principal=principal,
        catalog=state.catalog,
        tool_name=body.tool,
        raw_arguments=body.arguments,
        run_id=body.run_id or (existing.run_id if existing else None),
        started=time.perf_counter(),
    )
    await check_run(state, principal, attempt.run_id)
    call_id = existing.id if existing else new_id("call")
    decision = await decide_or_record_denial(state, attempt, call_id, existing)
    if attempt.tool is not None and attempt.tool.mutation:
        return Outcome(
            *await mutation.execute(state, attempt, decision, body, existing, idempotency_key)
        )
    return Outcome(await _read(state, attempt, decision, existing, call_id))


async def _read(
    state: AppState, attempt: Attempt, decision: Decision, existing: CallRow | None, call_id: str
) -> dict[str, Any]:
    call, tool = attempt.call, attempt.tool
    assert call is not None
    assert tool is not None
    if existing is not None and (existing.tool, existing.fingerprint) != (
        tool.name,
        call.fingerprint,
    ):
        raise InvalidRequest("call_id names a call with another tool, target or arguments")
    if attempt.run_id is not None:
        async with state.db.transaction() as conn:
            refusal = await admit_to_run(conn, attempt, new_call=existing is None, cost=tool.cost)
            if refusal is not None:
                await write_denial(
                    conn, attempt, call_id, refusal, new_call=existing is None, deny_call=False
                )
        if refusal is not None:
            raise refusal
    try:
        response = await state.providers.call(
            tool.provider, tool.execute, call.arguments, attempt.principal, call_id
        )
    except NotSent as exc:
        await _record_read(state, attempt, decision, existing, call_id, None)
        raise ProviderUnavailable("the provider could not be reached", call_id=call_id) from exc
    except TooLarge as exc:
        await _record_read(state, attempt, decision, existing, call_id, None)
        raise ProviderUnavailable(TOO_LARGE, call_id=call_id) from exc
    except Uncertain as exc:
        await _record_read(state, attempt, decision, existing, call_id, None)
        raise ProviderTimeout(
            "the provider did not answer in time", call_id=call_id, status="unknown"
        ) from exc
    answer = result_body(
        tool, call_id, None, classify(response.status), response.status, response.body
    )
    await _record_read(state, attempt, decision, existing, call_id, answer, response.elapsed_ms)
    if answer["status"] == "unknown":
        raise ProviderTimeout(
            "the provider did not give a usable answer", call_id=call_id, status="unknown"
        )
    return answer


async def _record_read(
    state: AppState,
    attempt: Attempt,
    decision: Decision,
    existing: CallRow | None,
    call_id: str,
    answer: dict[str, Any] | None,
    provider_ms: float | None = None,
) -> None:
    """A read's outcome: no execution record, just the call, its audit row and the run."""
    status = "succeeded" if answer is not None and answer["status"] == "succeeded" else "failed"
    call = attempt.call
    assert call is not None
    row = attempt.row(call_id, decision, None, status)
    event = attempt.event(
        "executed" if status == "succeeded" else "failed",
        call_id,
        decision="allow",
        authorized_by=row.authorized_by,
        outcome={
            "status": status,
            "provider_status": answer["provider_status"] if answer else None,
        },
        provider_ms=provider_ms,
    )
    async with writing(state, attempt) as conn:
        if existing is None:
            await store.insert_with_audit(conn, row, event)
        else:
            await store.set_state_with_audit(conn, call_id, status, event)
        await record_run_outcome(conn, attempt, status, answer["result"] if answer else None)
    telemetry.decided(attempt, call_id, quiet=True)
    telemetry.executed(attempt.tool_name, call_id, status)


async def dry_run(state: AppState, principal: Principal, body: DryRunBody) -> dict[str, Any]:
    """Preview a proposed call through the provider's ``dry_run`` endpoint, re-authorized."""
    existing = await visible_call(state, principal, body.call_id)
    if existing.arguments is None:
        raise InvalidRequest("a denied call cannot be previewed", call_id=existing.id)
    attempt = Attempt(
        principal=principal,
        catalog=state.catalog,
        tool_name=existing.tool,
        raw_arguments=existing.arguments,
        run_id=existing.run_id,
        started=time.perf_counter(),
    )
    known = state.catalog.tools.get(existing.tool)
    if known is not None and known.dry_run is None:
        raise InvalidRequest(f"tool {known.name!r} has no dry-run", call_id=existing.id)
    decision = await decide_or_record_denial(state, attempt, existing.id, existing)
    call, tool = attempt.call, attempt.tool
    assert call is not None
    assert tool is not None
    assert tool.dry_run is not None
    try:
        response = await state.providers.call(
            tool.provider, tool.dry_run, call.arguments, principal, existing.id
        )
    except NotSent as exc:
        raise ProviderUnavailable("the provider could not be reached") from exc
    except TooLarge as exc:
        raise ProviderUnavailable(TOO_LARGE, call_id=existing.id) from exc
    except Uncertain as exc:
        raise ProviderTimeout("the provider did not answer the preview in time") from exc
    if classify(response.status) != "succeeded":
        raise ProviderUnavailable(
            "the provider gave no preview", call_id=existing.id, provider_status=response.status
        )
    snapshot_hash = digest(response.body)
    ttl_s = tool.approval.ttl_s if tool.approval else DRY_RUN_TTL_S
    row = DryRunRow(
        id=new_id("dry"),
        call_id=existing.id,
        tenant=principal.tenant,
        actor=principal.sub,
        tool=tool.name,
        fingerprint=call.fingerprint,
        policy_version=state.catalog.policy_version,
        snapshot=response.body,
        snapshot_hash=snapshot_hash,
        expires_at=datetime.now(UTC) + timedelta(seconds=ttl_s),
    )
    next_step = "approval" if decision.impact == "high" else "execute"
    async with state.db.transaction() as conn:
        await store.insert_dry_run(conn, row)
        await store.set_state(
            conn,
            existing.id,
            "awaiting_approval" if next_step == "approval" else "previewed",
            unless=SETTLED,
        )
        await append(
            conn,
            attempt.event(
                "dry_run",
                existing.id,
                decision="allow",
                authorized_by=attempt.authorized_by(),
                outcome={"dry_run_id": row.id, "snapshot_hash": snapshot_hash},
                provider_ms=response.elapsed_ms,
            ),
        )
    telemetry.decided(attempt, existing.id)
    return {
        "dry_run_id": row.id,
        "call_id": existing.id,
        "snapshot": response.body,
        "snapshot_hash": snapshot_hash,
        "expires_at": row.expires_at.isoformat(),
        "next": next_step,
    }
