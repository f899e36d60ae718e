"""GET /calls/{id}: a call's whole life, for those entitled to see it.

Visible to its actor, to approvers of its tenant who may decide it, and to auditors of its
tenant (admins: any tenant); to anyone else it does not exist. Sensitive arguments are masked
in ``arguments`` for everyone: the history is a listing. An approver who may decide the call
now must judge what they approve, so the answer gives them the masked values beside it, in
``sensitive_arguments``; ``may_decide`` tells them (and the console) that they may.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import NamedTuple, TypeVar

from app.audit import store as audit
from app.audit.models import CallEvent
from app.auth.principal import Principal
from app.calls import store, waiting
from app.calls.answers import CallDecision, CallDryRun, CallHistory, CallProposal
from app.calls.models import CallRow, DryRunRow, ExecutionSummary
from app.calls.results import mask_arguments, sensitive_values
from app.calls.services import Services
from app.consent import rules
from app.consent import store as approvals
from app.consent.models import ApprovalRow
from app.errors import InvalidRequest, NotFound, Unavailable

T = TypeVar("T")


def may_see(state: Services, principal: Principal, call: CallRow) -> bool:
    settings = state.settings
    if settings.admin_role in principal.roles:
        return True
    if principal.tenant != call.tenant:
        return False
    if principal.sub == call.actor or settings.auditor_role in principal.roles:
        return True
    tool = state.catalog.tools.get(call.tool)
    return bool(
        tool is not None
        and tool.approval is not None
        and rules.may_approve(principal, call.actor, call.tenant, tool.approval.approvers)
    )


def may_decide(state: Services, principal: Principal, call: CallRow) -> bool:
    """Whether ``principal`` may approve or reject ``call`` now: it awaits a decision (as in
    the pending inbox) and they are one of its approvers."""
    tool = state.catalog.tools.get(call.tool)
    return bool(
        call.pending(datetime.now(UTC))
        and tool is not None
        and tool.approval is not None
        and rules.may_approve(principal, call.actor, call.tenant, tool.approval.approvers)
    )


async def history_after(
    state: Services, principal: Principal, call_id: str, wait_s: float | None
) -> CallHistory:
    """The call's history once it is no longer waiting (``waiting.is_waiting``), or when
    ``wait_s`` seconds have passed, whichever comes first; at once without ``wait_s``. The
    call is read again only when its state changed (or may have: see ``waiting``).

    Answered within ``MARGIN_S`` of ``wait_s`` however many wait: reads are shared
    (``history``), a waiter whose time is up answers from its last read when every change
    since was heard (one would have woken it), and a read it still needs is awaited at most
    ``READ_LATE_S`` past its time; then it is ``503 unavailable``, never late and never an
    answer older than a change it was told of."""
    if wait_s is None:
        return await history(state, principal, call_id)
    if not 0 < wait_s <= waiting.MAX_WAIT_S:
        raise InvalidRequest(
            f"wait is a number of seconds above 0 and at most {waiting.MAX_WAIT_S:g}"
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        async with state.waiters.watching(call_id) as changed:
            heard = state.waiters.listening  # every change from now on wakes this waiter
            found = await _in_time(history(state, principal, call_id), deadline)
            left = deadline - loop.time()
            if not waiting.is_waiting(found["state"], found["proposal"]["next"]) or left <= 0:
                return found
            try:
                await asyncio.wait_for(changed, left)
            except TimeoutError:
                if heard:
                    # Nothing changed since the read began: that read is the answer, at
                    # once, not a read queued behind every other waiter whose time is up.
                    return found
                # Read while nobody listened: a change may have gone unannounced.
                return await _in_time(history(state, principal, call_id), deadline)


MARGIN_S = 1.0
"""How late past its ``wait`` a waiter may be answered (docs/api.md; ``bench/waits.py``)."""
READ_LATE_S = 0.5
"""How long past its deadline a waiter waits for a read of the call: a pool busy past that
is answered ``503``, so that the rest of ``MARGIN_S`` is left for writing the answer."""


async def _in_time(read: Awaitable[T], deadline: float) -> T:
    """``read``, or ``Unavailable`` once it is ``READ_LATE_S`` past ``deadline``. Only this
    request stops waiting: a read it shares goes on for the others."""
    left = deadline - asyncio.get_running_loop().time()
    try:
        return await asyncio.wait_for(read, max(left, 0.0) + READ_LATE_S)
    except TimeoutError:
        raise Unavailable("the call could not be read in time; ask again") from None


class CallRecord(NamedTuple):
    """What a call's history shows, as stored: at most ``store.KEPT_DRY_RUNS`` previews and
    the newest ``EVENTS_SHOWN`` audit rows, with how many there are in all."""

    call: CallRow
    dry_runs: store.DryRuns
    decided: list[ApprovalRow]
    executions: list[ExecutionSummary]
    events: audit.CallEvents


SNAPSHOTS_SHOWN = 2
"""Previews a history shows whole: the latest, and the one before it."""
EVENTS_SHOWN = 200
"""Audit rows a history lists (the newest): a key replayed many times adds a row each time."""


async def _record(state: Services, call_id: str) -> CallRecord | None:
    async with state.db.connection() as conn:
        call = await store.get(conn, call_id)
        if call is None:
            return None
        return CallRecord(
            call,
            await store.dry_runs_of(conn, call.id, SNAPSHOTS_SHOWN),
            await approvals.of_call(conn, call.id),
            await store.executions_of(conn, call.id),
            await audit.of_call(conn, call.id, EVENTS_SHOWN),
        )


async def history(state: Services, principal: Principal, call_id: str) -> CallHistory:
    """The call's history as ``principal`` may see it; read together with concurrent
    requests for the same call (``CallWaiters.read_together``)."""
    record = await state.waiters.read_together(call_id, lambda: _record(state, call_id))
    if record is None or not may_see(state, principal, record.call):
        raise NotFound("no such call")
    call, dry_runs, decided, executions, events = record
    proposal, deciding = _proposal(state, principal, call)
    latest = decided[-1] if decided else None
    tool = state.catalog.tools.get(call.tool)
    agreed: frozenset[str] = frozenset()
    previewed = dry_runs.rows[-1].snapshot_hash if dry_runs.rows else None
    if latest is not None and latest.decision == "approve" and previewed == latest.snapshot_hash:
        agreed = rules.agreeing(latest, decided, datetime.now(UTC))  # else: a stale approval
    approvals_given = None
    if tool is not None and tool.approval is not None:
        approvals_given = f"{len(agreed)}/{rules.quorum(tool)}"
    return {
        "call_id": call.id,
        "tool": call.tool,
        "actor": call.actor,
        "tenant": call.tenant,
        "run_id": call.run_id,
        "tool_call_id": call.tool_call_id,
        "state": call.state,
        "may_decide": deciding and principal.sub not in agreed,  # a quorum's others
        "proposal": proposal,
        "decisions": [_decision(e) for e in events.rows],
        "decisions_total": events.total,
        "dry_runs": [_dry_run(d) for d in dry_runs.rows],
        "dry_runs_total": dry_runs.total,
        "approvals": approvals_given,
        "approval": None
        if latest is None
        else {
            "approval_id": latest.id,
            "decision": latest.decision,
            "approver": latest.approver,
            "comment": latest.comment,
            "binding": latest.binding,
            "created_at": _stored(latest.created_at),
            "expires_at": latest.expires_at.isoformat(),
            "consumed_by": latest.consumed_by,
            "consumed_at": (latest.consumed_at.isoformat() if latest.consumed_at else None),
        },
        "executions": [
            {
                "operation_id": x.operation_id,
                "state": x.state,
                "provider_status": x.provider_status,
                "approval_id": x.approval_id,
                "created_at": x.created_at.isoformat(),
                "updated_at": x.updated_at.isoformat(),
            }
            for x in executions
        ],
        "timings": {
            "created_at": _stored(call.created_at),
            "updated_at": _stored(call.updated_at),
            "decision_ms": events.decision_ms,
            "provider_ms": events.provider_ms,
        },
    }


async def to_decide(
    state: Services, principal: Principal, call_id: str
) -> tuple[CallProposal, CallDryRun | None]:
    """What an approver asked through MCP elicitation is shown: the call's proposal as
    ``principal`` may see it, and its latest preview (or ``None``), whose hash their
    decision binds. Only that preview is read, not the call's history."""
    async with state.db.connection() as conn:
        call = await store.get(conn, call_id)
        latest = await store.latest_dry_run(conn, call_id) if call is not None else None
    if call is None or not may_see(state, principal, call):
        raise NotFound("no such call")
    proposal, _ = _proposal(state, principal, call)
    return proposal, None if latest is None else _dry_run(latest)


def _proposal(state: Services, principal: Principal, call: CallRow) -> tuple[CallProposal, bool]:
    """The call's proposal as ``principal`` may see it, and whether they may decide it."""
    tool = state.catalog.tools.get(call.tool)
    # Arguments are stored only once their tool validated them: a tool the catalog no
    # longer holds took with it which of them were sensitive, so none is shown.
    sensitive = tool.sensitive_args if tool else (call.arguments or {})
    proposal: CallProposal = {
        "arguments": mask_arguments(call.arguments, sensitive),
        "fingerprint": call.fingerprint,
        "target": call.target,
        "mutation": call.mutation,
        "impact": call.impact,
        "next": call.next,
        "decision": call.decision,
        "code": call.code,
        "reason": call.reason,
        "policy_version": call.policy_version,
        "proposed_by": call.proposed_by,
        "authorized_by": call.authorized_by,
        "taint": call.taint or [],
    }
    if call.endorsement:
        proposal["endorsement"] = call.endorsement
    deciding = may_decide(state, principal, call)
    if sensitive and deciding:
        proposal["sensitive_arguments"] = sensitive_values(call.arguments, sensitive)
    return proposal, deciding


def _decision(e: CallEvent) -> CallDecision:
    """An audit row of the call, as a history shows it (``audit.of_call``)."""
    return {
        "seq": e.seq,
        "at": e.at.isoformat(),
        "event": e.event,
        "decision": e.decision,
        "code": e.code,
        "reason": e.reason,
        "policy_version": e.policy_version,
        "approval_id": e.approval_id,
        "authorized_by": e.authorized_by,
        "outcome": e.outcome,
        "total_ms": e.total_ms,
        "provider_ms": e.provider_ms,
    }


def _dry_run(d: DryRunRow) -> CallDryRun:
    return {
        "dry_run_id": d.id,
        "fingerprint": d.fingerprint,
        # Only the newest previews carry their snapshot (``store.dry_runs_of``): each may
        # be as large as a provider's answer may be; older ones are named by their hash.
        "snapshot": d.snapshot,
        "snapshot_hash": d.snapshot_hash,
        "policy_version": d.policy_version,
        "created_at": _stored(d.created_at),
        "expires_at": d.expires_at.isoformat(),
    }


def _stored(value: datetime | None) -> str:
    """When a row read from the database was made or changed (``None`` only in a row not
    yet written)."""
    assert value is not None
    return value.isoformat()
