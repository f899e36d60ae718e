"""Recording a call: its stored row, its audit rows, denials, and its run's counters.

Every decision, allow or deny, is stored with its audit row before the caller hears the
answer; a denied call never reaches the provider. What is recorded is a ``Request`` (who
asked, under which catalog) and, once its arguments passed the schema, its ``PreparedCall``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from app import evidence, recordable, telemetry
from app.audit.store import AuditEvent, append
from app.calls import store
from app.calls.models import Authorized, CallRow, Request
from app.calls.policy import Decision, PreparedCall
from app.calls.results import mask_arguments
from app.calls.states import STARTED, CallState
from app.catalog.models import Tool
from app.db import Connection, Database
from app.errors import ToolgateError
from app.runs import service as runs
from app.runs.provenance import Taint
from app.runs.store import Told

PROPOSED_BY: Final = "model"
APPROVAL_WINDOW_S = 300
"""How long a preview, and a call awaiting approval, stays open for a tool that names no
``approval.ttl_s``."""


def approval_window_s(tool: Tool) -> int:
    """How long a request for approval stays open: the approval's ``ttl_s``."""
    return tool.approval.ttl_s if tool.approval else APPROVAL_WINDOW_S


def recorded_tool(request: Request) -> str:
    """The tool name as stored: a catalog name, or the requested one in ``recordable`` form
    (an unknown tool's name is raw input)."""
    return request.tool.name if request.tool else recordable.text(request.tool_name)


def authorized_by(request: Request) -> evidence.AuthorizedBy:
    return {
        "kind": "policy",
        "sub": request.principal.sub,
        "tenant": request.principal.tenant,
        "policy_version": request.catalog.policy_version,
    }


def call_row(
    request: Request,
    call: PreparedCall | None,
    call_id: str,
    decision: Decision | None,
    error: ToolgateError | None,
    state: CallState | None = None,
) -> CallRow:
    """The call as stored: ``state`` defaults to ``denied`` or ``proposed``."""
    tool, target = request.tool, call.target if call else None
    pending_until = None
    if state == "awaiting_approval" and tool is not None:
        pending_until = datetime.now(UTC) + timedelta(seconds=approval_window_s(tool))
    return CallRow(
        id=call_id,
        tenant=request.principal.tenant,
        actor=request.principal.sub,
        tool=recorded_tool(request),
        run_id=request.run_id,
        tool_call_id=request.tool_call_id,
        arguments=call.arguments if call else None,
        fingerprint=call.fingerprint if call else None,
        target_type=target.type if target else None,
        target_id=target.id if target else None,
        mutation=tool.mutation if tool else None,
        impact=decision.impact if decision else None,
        decision="deny" if error else "allow",
        code=error.code if error else None,
        reason=error.detail if error else None,
        next=decision.next if decision else None,
        state=state or ("denied" if error else "proposed"),
        policy_version=request.catalog.policy_version,
        proposed_by=PROPOSED_BY,
        authorized_by=None if error else authorized_by(request),
        taint=taint_list(decision, error),
        pending_until=pending_until,
        endorsement=endorsement_list(decision, error),
    )


def taint_list(
    decision: Decision | None, error: ToolgateError | None
) -> list[evidence.Taint] | None:
    """The taint a decision found, or a taint denial named: ``[{argument, source_call_id}]``;
    ``None`` when there is none."""
    if decision is not None:
        return [t.as_dict() for t in decision.taint] or None
    return (error.extra.get("taint") or None) if error is not None else None


def endorsement_list(
    decision: Decision | None, error: ToolgateError | None
) -> list[evidence.EndorsementItem] | None:
    """What endorses each ``x-endorsed`` argument (or why nothing does), as the decision
    found it or an endorsement denial named it: argument names and sources, never values;
    ``None`` when the tool has no such argument."""
    if decision is not None:
        return [e.as_dict() for e in decision.endorsement] or None
    return (error.extra.get("endorsement") or None) if error is not None else None


def audit_event(
    request: Request, call: PreparedCall | None, event: str, call_id: str, **fields: Any
) -> AuditEvent:
    """An audit row about the call; sensitive arguments masked."""
    tool = request.tool
    arguments = call.arguments if call else recordable.recorded(request.raw_arguments)
    return AuditEvent(
        event=event,
        tenant=request.principal.tenant,
        actor=request.principal.sub,
        call_id=call_id,
        run_id=request.run_id,
        tool=recorded_tool(request),
        target=call.target.as_dict() if call and call.target else None,
        fingerprint=call.fingerprint if call else None,
        arguments=mask_arguments(arguments, tool.sensitive_args if tool else ()),
        policy_version=request.catalog.policy_version,
        proposed_by=PROPOSED_BY,
        total_ms=(time.perf_counter() - request.started) * 1000,
        **fields,
    )


async def record_refusal(
    db: Database,
    request: Request,
    call: PreparedCall | None,
    call_id: str,
    error: ToolgateError,
    *,
    new_call: bool,
    deny_call: bool,
    taint: tuple[Taint, ...] = (),
) -> None:
    """``error`` recorded as the call's denial (an expired approval as ``expired``), in a
    transaction of its own, when its class is one that is (``ToolgateError.recorded``)."""
    if not error.recorded:
        return
    async with db.transaction() as conn:
        await write_denial(
            conn,
            request,
            call,
            call_id,
            error,
            new_call=new_call,
            deny_call=deny_call,
            event="expired" if error.code == "approval_expired" else "denied",
            taint=taint,
        )


async def write_denial(
    conn: Connection,
    request: Request,
    call: PreparedCall | None,
    call_id: str,
    error: ToolgateError,
    *,
    new_call: bool,
    deny_call: bool,
    event: str = "denied",
    taint: tuple[Taint, ...] = (),
) -> None:
    """Store a denial with its audit row, in the caller's transaction; ``deny_call`` also
    marks an existing call denied. A new denied call still counts against its run: a loop
    of refused calls is a loop too. The audit row's ``outcome`` holds the error's audited
    members and the ``taint`` the refused decision had found (sources, never values)."""
    error.extra["call_id"] = call_id
    outcome = {name: error.extra[name] for name in error.audited if name in error.extra}
    if taint:
        outcome["taint"] = [t.as_dict() for t in taint]
    audit = audit_event(
        request,
        call,
        event,
        call_id,
        decision="deny",
        code=error.code,
        reason=error.detail,
        outcome=outcome or None,
    )
    if new_call:
        await store.insert_with_audit(conn, call_row(request, call, call_id, None, error), audit)
        if request.run_id is not None:
            await runs.count_denied(conn, request.run_id)
    elif deny_call:
        await store.set_state_with_audit(conn, call_id, "denied", audit)
    else:
        await append(conn, audit)
    telemetry.decided(request, call_id, error.code)


async def counts_as_call(conn: Connection, existing: CallRow | None) -> bool:
    """Whether an execute counts one more call against its run: always, unless it names an
    earlier call that has not run yet (its proposal was counted). Running a call again is
    another call, or re-executing one call id would loop past ``max_calls``. Judged on the
    call's row, locked until the caller's transaction ends, in which an uncounted execution
    marks the call started (``executing``): of parallel executions of one call id only one
    is the proposal's, and every other one counts."""
    return existing is None or await store.lock(conn, existing.id) in STARTED


async def admit_to_run(
    conn: Connection, authorized: Authorized, *, new_call: bool, cost: float
) -> ToolgateError | None:
    """Count this call, if ``new_call``, and charge ``cost`` against its run, if it has one;
    the 429 to record and answer otherwise."""
    if authorized.run_id is None:
        return None
    return await runs.admit(
        conn,
        authorized.principal,
        authorized.run_id,
        authorized.call.fingerprint,
        authorized.request.catalog,
        new_call=new_call,
        cost=cost,
    )


async def record_run_outcome(
    conn: Connection,
    request: Request,
    call: PreparedCall,
    call_id: str,
    status: str,
    result: Any,
) -> None:
    """Feed an outcome into the run's counters, and remember the result it returns
    (``run_outcome``), in the transaction that stores the result."""
    if request.run_id is not None:
        await runs.tell(conn, run_outcome(request.run_id, call, call_id, status, result))


def run_outcome(
    run_id: str, call: PreparedCall, call_id: str, status: str, result: Any, *, counted: bool = True
) -> Told:
    """What the result of ``call`` tells its run (``runs.told``)."""
    return runs.told(
        run_id,
        call.fingerprint,
        call_id,
        status,
        result,
        trusted=call.tool.trusted,
        arguments=call.arguments,
        counted=counted,
    )


async def remember_result(
    conn: Connection, run_id: str, call: PreparedCall, call_id: str, status: str, result: Any
) -> None:
    """Remember a result the run is given again (a replay): its strings, not its counters."""
    await runs.tell(conn, run_outcome(run_id, call, call_id, status, result, counted=False))
