"""Executing a mutation exactly once (SPEC §4 /execute, §6).

PostgreSQL decides: the ``(tenant, actor, key)`` claim is unique and the approval is
consumed by a conditional update, both in one transaction; outcomes move records only out of
open states. The Redis lock merely keeps two instances from working on one key at once. A
retry that finds an open record whose worker is gone (its lock lapsed) reconciles it with
the provider instead of repeating it, and the provider deduplicates on the operation id.
Commits on the happy path: the claim, then the outcome with its audit row.

Once a request may have reached the provider, the answer is never "nothing ran": any
uncertainty, including a database that fails while the outcome is being stored, is a 504
naming the operation. A record whose outcome could not be stored stays open, and the
background reconciler (``reconciler``) resolves it through ``reconcile`` below.
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from app import telemetry
from app.approvals import store as approvals
from app.approvals.models import ApprovalRow
from app.audit.store import append
from app.calls import gates, store
from app.calls.decisions import (
    Attempt,
    admit_to_run,
    record_denial,
    record_run_outcome,
    refund_run,
    write_denial,
    writing,
)
from app.calls.models import CallRow, ExecuteBody, ExecutionRow
from app.calls.policy import Decision
from app.calls.results import classify, result_body
from app.catalog.models import Tool
from app.errors import (
    ApprovalConsumed,
    ApprovalRejected,
    IdempotencyInFlight,
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    InvalidRequest,
    ProviderTimeout,
    ProviderUnavailable,
    ToolgateError,
    Unavailable,
)
from app.ids import new_id
from app.outbound import NotSent, Response, Uncertain
from app.state import AppState

LOCK_MARGIN_S = 5.0
FINISHED = ("succeeded", "failed")
log = logging.getLogger("toolgate")
_KEY = re.compile(r'"([A-Za-z0-9_-]{16,255})"|([A-Za-z0-9_-]{16,255})')

Answer = tuple[dict[str, Any], dict[str, str]]


def parse_key(header: str | None) -> str:
    """The Idempotency-Key: 16-255 of ``[A-Za-z0-9_-]``, bare or as a quoted sf-string."""
    if header is None or not header.strip():
        raise IdempotencyKeyMissing("a mutation needs an Idempotency-Key header")
    match = _KEY.fullmatch(header.strip())
    if match is None:
        raise IdempotencyKeyInvalid("Idempotency-Key must be 16-255 characters of [A-Za-z0-9_-]")
    return match.group(1) or match.group(2)


def lock_name(tenant: str, actor: str, key: str) -> str:
    """The Redis lock a request on this key holds while it works on the key's record."""
    return "idem:" + hashlib.sha256(f"{tenant}\0{actor}\0{key}".encode()).hexdigest()


def lock_ttl(tool: Tool) -> float:
    """Longer than a provider call may take: a lapsed lock means its holder is gone."""
    return tool.provider.timeout_s + LOCK_MARGIN_S


async def execute(
    state: AppState,
    attempt: Attempt,
    decision: Decision,
    body: ExecuteBody,
    existing: CallRow | None,
    header: str | None,
) -> Answer:
    key = parse_key(header)
    call, tool = attempt.call, attempt.tool
    assert call is not None
    assert tool is not None
    lock = lock_name(attempt.principal.tenant, attempt.principal.sub, key)
    async with state.locks.hold(lock, lock_ttl(tool)) as held:
        if not held:
            raise IdempotencyInFlight("the original request with this key is still running")
        if _ungated(attempt, decision, existing):
            answer = await _claim_ungated(state, attempt, decision, key)
            if answer is not None:
                return answer
        record = await _record(state, attempt, key)
        if record is None:
            return await _first_call(state, attempt, decision, body, existing, key)
        if record.state in FINISHED:
            return await _replay(state, attempt, record)
        return await _resume(state, attempt, record)


def _ungated(attempt: Attempt, decision: Decision, existing: CallRow | None) -> bool:
    """No approval, dry-run, run or earlier call to check: the claim can come first."""
    assert attempt.tool is not None
    return (
        decision.impact != "high"
        and not attempt.tool.require_dry_run
        and existing is None
        and attempt.run_id is None
    )


async def _claim_ungated(
    state: AppState, attempt: Attempt, decision: Decision, key: str
) -> Answer | None:
    """Claim the key and record the new call in one statement, then send; ``None`` when the
    key is taken (its record decides: replay, resume or a reused key). A fresh key, the
    usual case, costs no read of its record."""
    execution = _execution(state, attempt, new_id("call"), key, None)
    row = attempt.row(execution.call_id, decision, None, "executing")
    async with state.db.connection() as conn:
        if not await store.claim(conn, execution, row):
            return None
    telemetry.decided(attempt, execution.call_id, quiet=True)
    return await _send(state, attempt, execution, resumed=False)


def _execution(
    state: AppState, attempt: Attempt, call_id: str, key: str, approval_id: str | None
) -> ExecutionRow:
    """The in-flight record a first call claims its key with."""
    call, tool, principal = attempt.call, attempt.tool, attempt.principal
    assert call is not None
    assert tool is not None
    return ExecutionRow(
        operation_id=new_id("op"),
        tenant=principal.tenant,
        actor=principal.sub,
        idempotency_key=key,
        call_id=call_id,
        tool=tool.name,
        target_type=call.target.type if call.target else None,
        target_id=call.target.id if call.target else None,
        fingerprint=call.fingerprint,
        approval_id=approval_id,
        state="in_flight",
        provider_status=None,
        response=None,
        expires_at=datetime.now(UTC) + timedelta(seconds=state.settings.idempotency_ttl_s),
    )


async def _record(state: AppState, attempt: Attempt, key: str) -> ExecutionRow | None:
    """This actor's record for the key; a record for another call is a reused key."""
    call, principal = attempt.call, attempt.principal
    assert call is not None
    async with state.db.connection() as conn:
        record = await store.get_execution(conn, principal.tenant, principal.sub, key)
    if record is not None and (record.tool, record.fingerprint) != (
        attempt.tool_name,
        call.fingerprint,
    ):
        raise IdempotencyKeyReused(
            "this Idempotency-Key was used for another tool, target or arguments"
        )
    return record


async def _replay(state: AppState, attempt: Attempt, record: ExecutionRow) -> Answer:
    assert record.response is not None
    async with state.db.transaction() as conn:
        await append(
            conn,
            attempt.event(
                "replayed",
                record.call_id,
                decision="allow",
                approval_id=record.approval_id,
                outcome={"status": record.state, "operation_id": record.operation_id},
            ),
        )
    telemetry.decided(attempt, record.call_id, quiet=True)
    telemetry.executed(record.tool, record.call_id, "replayed")
    return {**record.response, "replayed": True}, {"Idempotent-Replayed": "true"}


async def _first_call(
    state: AppState,
    attempt: Attempt,
    decision: Decision,
    body: ExecuteBody,
    existing: CallRow | None,
    key: str,
) -> Answer:
    call, tool = attempt.call, attempt.tool
    assert call is not None
    assert tool is not None
    call_id = existing.id if existing else None
    approval: ApprovalRow | None = None
    try:
        if existing is not None and existing.state == "rejected":
            raise ApprovalRejected("the approver rejected this call; the rejection is final")
        if decision.impact == "high":
            approval = await gates.valid_approval(state, attempt, body)
            call_id = call_id or approval.call_id
        elif tool.require_dry_run:
            await gates.require_dry_run(state, attempt, body.dry_run_id)
        if existing is not None and existing.fingerprint != call.fingerprint:
            raise InvalidRequest("call_id names a call with another tool, target or arguments")
    except ToolgateError as error:
        if error.status in (403, 409):
            await record_denial(
                state,
                attempt,
                call_id or new_id("call"),
                error,
                new_call=call_id is None,
                deny_call=False,
                event="expired" if error.code == "approval_expired" else "denied",
            )
        raise
    call_id = call_id or new_id("call")
    execution = _execution(state, attempt, call_id, key, approval.id if approval else None)
    new_call = existing is None and approval is None
    async with state.db.transaction() as conn:
        refusal = await admit_to_run(conn, attempt, new_call=new_call, cost=tool.cost)
        if refusal is not None:
            await write_denial(conn, attempt, call_id, refusal, new_call=new_call, deny_call=False)
        else:
            if new_call:
                row = attempt.row(call_id, decision, None, "executing")
                claimed = await store.claim(conn, execution, row)
            else:
                await store.set_state(conn, call_id, "executing")
                claimed = await store.claim(conn, execution)
            if not claimed:
                raise IdempotencyInFlight("the original request with this key is still running")
            if approval is not None and not await approvals.consume(
                conn, approval.id, execution.operation_id
            ):
                raise ApprovalConsumed("the approval was used by another execution")
    if refusal is not None:
        raise refusal
    telemetry.decided(attempt, call_id, quiet=True)
    return await _send(state, attempt, execution, resumed=False)


async def _resume(state: AppState, attempt: Attempt, record: ExecutionRow) -> Answer:
    """An open record whose worker is gone: ask the provider what happened before acting;
    re-send (with the same operation id) only when it cannot say or never saw it."""
    telemetry.decided(attempt, record.call_id)
    answer = await reconcile(state, attempt, record)
    if answer is None:
        return await _send(state, attempt, record, resumed=True)
    return answer


async def reconcile(state: AppState, attempt: Attempt, record: ExecutionRow) -> Answer | None:
    """Ask the tool's ``reconcile`` endpoint what became of the open ``record``, and store a
    finished outcome exactly as a first send would have (what replays answer from then on).
    ``None`` when the tool has no such endpoint or the provider never saw the operation. No
    usable answer: the record is marked unknown and ``ProviderTimeout`` raised. A client's
    retry and the background reconciler both resolve records through here."""
    tool = attempt.tool
    assert tool is not None
    if tool.reconcile is None:
        return None
    try:
        response = await state.providers.call(
            tool.provider,
            tool.reconcile,
            {"operation_id": record.operation_id},
            attempt.principal,
            record.call_id,
        )
    except (NotSent, Uncertain) as exc:
        await mark_unknown(state, attempt, record)
        raise _timeout(record) from exc
    body = response.body if isinstance(response.body, dict) else {}
    if response.status == 404:
        return None
    if response.status != 200 or body.get("status") not in FINISHED:
        await mark_unknown(state, attempt, record)
        raise _timeout(record)
    provider_status = body.get("provider_status")
    if not isinstance(provider_status, int):
        provider_status = 200 if body["status"] == "succeeded" else 400
    outcome = Response(provider_status, body.get("result"), response.elapsed_ms)
    return await _store_outcome(state, attempt, record, outcome, body["status"], "reconciled")


async def _send(
    state: AppState, attempt: Attempt, record: ExecutionRow, *, resumed: bool
) -> Answer:
    """Forward with the operation id as the provider's Idempotency-Key; store the outcome."""
    tool, call = attempt.tool, attempt.call
    assert tool is not None
    assert call is not None
    try:
        response = await state.providers.call(
            tool.provider,
            tool.execute,
            call.arguments,
            attempt.principal,
            record.call_id,
            operation_id=record.operation_id,
        )
    except NotSent as exc:
        if not resumed:
            await _release(state, attempt, record)
            raise ProviderUnavailable(
                "the provider could not be reached; nothing ran", call_id=record.call_id
            ) from exc
        await mark_unknown(state, attempt, record)
        raise _timeout(record) from exc
    except Uncertain as exc:
        await mark_unknown(state, attempt, record)
        raise _timeout(record) from exc
    status = classify(response.status)
    if status == "unknown":
        await mark_unknown(state, attempt, record, response.status)
        raise _timeout(record)
    return await _store_outcome(
        state,
        attempt,
        record,
        response,
        status,
        "reconciled" if resumed else ("executed" if status == "succeeded" else "failed"),
    )


async def _store_outcome(
    state: AppState,
    attempt: Attempt,
    record: ExecutionRow,
    response: Response,
    status: str,
    event: str,
) -> Answer:
    """Finish ``record`` with the provider's answer and its audit row. The provider has
    acted: if the database fails now, the answer is still the 504 of an unknown outcome,
    and the record, still open, is left to reconciliation."""
    tool = attempt.tool
    assert tool is not None
    answer = result_body(
        tool, record.call_id, record.operation_id, status, response.status, response.body
    )
    audit = attempt.event(
        event,
        record.call_id,
        decision="allow",
        approval_id=record.approval_id,
        authorized_by=attempt.authorized_by(),
        outcome={
            "status": status,
            "provider_status": response.status,
            "operation_id": record.operation_id,
        },
        provider_ms=response.elapsed_ms,
    )
    try:
        async with writing(state, attempt) as conn:
            if await store.finish(
                conn, record.operation_id, status, response.status, answer, audit
            ):
                await record_run_outcome(conn, attempt, status, answer["result"])
                finished = None
            else:  # another worker (whose lock had lapsed) recorded the outcome first
                finished = await store.get_execution(
                    conn, record.tenant, record.actor, record.idempotency_key
                )
    except Unavailable as exc:
        _unrecorded(record, status)
        raise _timeout(record) from exc
    if finished is not None:
        if finished.response is None:
            raise _timeout(record)
        return {**finished.response, "replayed": True}, {"Idempotent-Replayed": "true"}
    telemetry.executed(record.tool, record.call_id, status)
    return answer, {}


async def _release(state: AppState, attempt: Attempt, record: ExecutionRow) -> None:
    """Nothing reached the provider: free the key and give the approval back."""
    async with state.db.transaction() as conn:
        await store.release(conn, record.operation_id)
        await approvals.release(conn, record.operation_id)
        await refund_run(conn, attempt)
        await store.set_state(
            conn, record.call_id, "approved" if record.approval_id else "proposed"
        )
        await append(
            conn,
            attempt.event(
                "failed",
                record.call_id,
                decision="allow",
                code="provider_unavailable",
                reason="provider unreachable; nothing ran",
                approval_id=record.approval_id,
            ),
        )
    telemetry.executed(record.tool, record.call_id, "failed")


async def mark_unknown(
    state: AppState, attempt: Attempt, record: ExecutionRow, provider_status: int | None = None
) -> None:
    """The provider may have acted: keep the record open as ``unknown`` for reconciliation.
    Only the move out of ``in_flight`` is news, audited and counted once; a record already
    unknown stays as it is. When the database is unavailable the record stays in flight
    (the reconciler's to resolve) and the caller still answers with ``_timeout``."""
    event = attempt.event(
        "failed",
        record.call_id,
        decision="allow",
        code="provider_timeout",
        reason="outcome unknown until reconciled",
        approval_id=record.approval_id,
        outcome={
            "status": "unknown",
            "provider_status": provider_status,
            "operation_id": record.operation_id,
        },
    )
    try:
        async with state.db.transaction() as conn:
            changed = await store.finish(
                conn, record.operation_id, "unknown", provider_status, None, event
            )
            if changed:
                await record_run_outcome(conn, attempt, "unknown", None)
    except Unavailable:
        _unrecorded(record, "unknown")
        return
    if changed:
        telemetry.executed(record.tool, record.call_id, "unknown")


def _unrecorded(record: ExecutionRow, status: str) -> None:
    log.warning(
        "outcome %s of operation %s not recorded: database unavailable; left to reconciliation",
        status,
        record.operation_id,
    )


def _timeout(record: ExecutionRow) -> ToolgateError:
    return ProviderTimeout(
        "the provider's outcome is unknown; retry with the same Idempotency-Key to reconcile",
        call_id=record.call_id,
        operation_id=record.operation_id,
        status="unknown",
    )
