"""Use cases for tool calls: propose, dry-run, and execute (reads here, mutations in
``mutation``). Each reads the app's catalog once, into its ``Request``.

Where a call's change is written: without a run, the change and its audit row are one
statement (``store.*_with_audit``), atomic by itself, on a plain connection (a transaction
would add BEGIN and COMMIT round trips to the hot path); with a run, its counters change
too, in one transaction.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app import telemetry
from app.audit.store import AuditEvent, append
from app.auth.principal import Principal
from app.calls import gates, mutation, store
from app.calls.answers import Execution, Preview, Proposal
from app.calls.authorization import approved_call, authorize, on_its_run, visible_call, with_run
from app.calls.models import (
    Answer,
    Authorized,
    CallRow,
    DryRunBody,
    DryRunRow,
    ExecuteBody,
    IdempotencyKey,
    ProposeBody,
    Request,
)
from app.calls.recording import (
    PROPOSED_BY,
    admit_to_run,
    approval_window_s,
    audit_event,
    authorized_by,
    call_row,
    counts_as_call,
    endorsement_list,
    record_refusal,
    run_outcome,
    write_denial,
)
from app.calls.results import classify, result_body, trimmed
from app.calls.services import Services
from app.calls.states import FINAL, OUTCOMES, SETTLED, CallState, Finished, Next
from app.canonical import digest
from app.catalog.models import Catalog
from app.consent import rules
from app.consent import store as approvals
from app.db import Connection, Writer
from app.errors import (
    ApprovalConsumed,
    ApprovalMismatch,
    InvalidRequest,
    NotFound,
    ProviderTimeout,
    ProviderUnavailable,
    ToolgateError,
)
from app.ids import new_id
from app.outbound import NotSent, TooLarge, Uncertain
from app.runs import service as runs
from app.runs.store import Told
from app.webhooks import store as webhooks


async def propose(state: Services, principal: Principal, body: ProposeBody) -> Proposal:
    request = Request.under(
        state.catalog, principal, body.tool, body.arguments, body.run_id, body.tool_call_id
    )
    request = await with_run(state.db, request)
    call_id = new_id("call")
    authorized = await authorize(state, request, call_id, None)
    call, decision = authorized.call, authorized.decision
    awaiting: CallState | None = "awaiting_approval" if decision.next == "approval" else None
    row = call_row(request, call, call_id, decision, None, awaiting)
    event = audit_event(
        request,
        call,
        "proposed",
        call_id,
        decision="allow",
        reason=f"next: {decision.next}",
        authorized_by=row.authorized_by,
        outcome=proposal_outcome(row),
    )
    announced = awaiting is not None and request.catalog.subscribers(webhooks.APPROVAL_REQUESTED)
    if request.run_id is None and not announced:
        await store.insert_with_audit(state.db, row, event)
    else:
        async with state.db.transaction() as conn:
            refusal = await admit_to_run(conn, authorized, new_call=True, cost=0.0)
            if refusal is not None:
                await write_denial(
                    conn, request, call, call_id, refusal, new_call=True, deny_call=False
                )
            else:
                await store.insert_with_audit(conn, row, event)
                if awaiting is not None:
                    await _announce_awaiting(conn, state.settings.public_url, request.catalog, row)
        if refusal is not None:
            raise refusal
    telemetry.decided(authorized, call_id)
    proposal: Proposal = {
        "call_id": call_id,
        "tool": row.tool,
        "decision": "allow",
        "mutation": authorized.tool.mutation,
        "impact": decision.impact,
        "next": decision.next,
        "arguments": call.arguments,
        "fingerprint": call.fingerprint,
        "target": row.target,
        "policy_version": row.policy_version,
        "proposed_by": PROPOSED_BY,
        "authorized_by": authorized_by(request),
        "taint": row.taint or [],
    }
    if row.endorsement:
        proposal["endorsement"] = row.endorsement
    return proposal


def proposal_outcome(row: CallRow) -> dict[str, Any] | None:
    """What a proposal's audit row records of its findings: taint and endorsement (argument
    names and sources, never values)."""
    found = {"taint": row.taint, "endorsement": row.endorsement}
    return {name: value for name, value in found.items() if value} or None


async def execute(
    state: Services, principal: Principal, body: ExecuteBody, key: IdempotencyKey
) -> Answer:
    """Run a call now, re-authorized from scratch: reads here, mutations exactly once. A
    call named by ``call_id`` or ``approval_id`` runs in that call's run, and no other."""
    existing = (
        None if body.call_id is None else await visible_call(state.db, principal, body.call_id)
    )
    approved = await approved_call(state.db, principal, body.approval_id)
    named = existing or approved
    if named is not None and body.run_id not in (None, named.run_id):
        raise InvalidRequest("run_id differs from the run of the call it executes")
    run_id = body.run_id if body.run_id is not None else named.run_id if named else None
    tool_name, arguments = _what_to_run(body, existing)
    request = Request.under(state.catalog, principal, tool_name, arguments, run_id)
    if run_id is not None and not (
        _scope_at_admission(request, body) and state.own_runs.owns(principal, run_id)
    ):
        request = await with_run(state.db, request)
        assert request.run is not None
        state.own_runs.saw(request.run)
    call_id = existing.id if existing else new_id("call")
    authorized = await authorize(
        state, request, call_id, existing, own_arguments=body.arguments is None
    )
    if authorized.decision.impact != "high":  # else the approval's gate judges both ids
        if body.approval_id is not None and approved is None:
            raise NotFound("no such approval", call_id=call_id if existing else None)
        if body.dry_run_id is not None and not authorized.tool.require_dry_run:
            await gates.named_dry_run(state.db, authorized, body.dry_run_id)
    if authorized.tool.mutation:
        execution = mutation.Execution(
            state, authorized, key.required(), existing, body.approval_id, body.dry_run_id
        )
        return await execution.run()
    if authorized.decision.impact == "high" and existing is None and approved is not None:
        existing, call_id = approved, approved.id  # a read approved: it runs that call
    return Answer(
        await _read(state, authorized, existing, call_id, body.approval_id, body.dry_run_id)
    )


def _scope_at_admission(request: Request, body: ExecuteBody) -> bool:
    """Whether ``request``, in a run known to be the caller's (``OwnRuns``), is decided
    before its run is read: a new read (naming no call, approval or dry-run) of a tool none
    of whose arguments needs endorsing (the run's task would endorse). Its run's scope is
    judged where the call is admitted, in the one statement that counts it (``_read``), so
    an allowed read reads nothing of its run before its provider is asked. Anything else is
    settled on the run as read: a refusal is recorded (the scope rule comes last, so it is
    the same refusal), and an approval to ask for, or a call not admitted as decided, is
    decided again on the same facts and the run's scope (``authorization.on_its_run``).
    The policy does not change: a call inside its run's scope, or in a run without one, is
    decided as if the run had no scope, and only such a call is admitted."""
    tool = request.tool
    return (
        body.call_id is None
        and body.approval_id is None
        and body.dry_run_id is None
        and tool is not None
        and not tool.mutation
        and not tool.endorsed_args
    )


def _what_to_run(body: ExecuteBody, existing: CallRow | None) -> tuple[str, Any]:
    """The tool and raw arguments to decide on: the body's, or else those of the call it
    names (its normalized arguments, which decide to themselves). A tool other than the
    call's is refused before anything is decided or recorded on that call."""
    if existing is None:
        assert body.tool is not None  # ExecuteBody requires both without a call_id
        assert body.arguments is not None
        return body.tool, body.arguments
    if body.tool is not None and body.tool != existing.tool:
        raise ApprovalMismatch(
            "call_id names a call of another tool", call_id=existing.id, mismatch=["tool"]
        )
    if body.arguments is not None:
        return existing.tool, body.arguments
    if existing.arguments is None:
        raise InvalidRequest(
            "a call denied before its arguments were valid cannot run", call_id=existing.id
        )
    return existing.tool, existing.arguments


async def _read(
    state: Services,
    authorized: Authorized,
    existing: CallRow | None,
    call_id: str,
    approval_id: str | None = None,
    dry_run_id: str | None = None,
) -> Execution:
    """A read, run now. One that needs an approval (an unendorsed argument, a tool outside
    its run's scope) passes the approval gate as a mutation's first call does, and uses the
    approval up before its provider is asked: a read approved once runs once."""
    request, call, tool = authorized.request, authorized.call, authorized.tool
    gates.check_same_call(existing, call)
    approved = authorized.decision.impact == "high"
    if approved:
        await _use_read_approval(state, authorized, existing, call_id, approval_id, dry_run_id)
    alone = existing is None and not approved  # a new call: its admission is all it writes
    if request.run_id is not None and not (
        alone
        and await runs.admit_at_once(
            state.db,
            request.principal,
            request.run_id,
            call.fingerprint,
            new_call=True,
            cost=tool.cost,
            within=tool.name if request.run_unread else None,
        )
    ):
        if request.run_unread:  # not admitted as decided: decided again on its run as read
            again = await on_its_run(state.db, authorized, call_id, existing is None)
            return await _read(state, again, existing, call_id, approval_id, dry_run_id)
        async with state.db.transaction() as conn:
            # An approved read is the call its proposal counted, now executing.
            counted = not approved and await counts_as_call(conn, existing)
            refusal = await admit_to_run(conn, authorized, new_call=counted, cost=tool.cost)
            if refusal is not None:
                await write_denial(
                    conn,
                    request,
                    call,
                    call_id,
                    refusal,
                    new_call=existing is None,
                    deny_call=False,
                )
            elif not counted:
                await store.set_state(conn, call_id, "executing")
        if refusal is not None:
            raise refusal
    try:
        response = await state.providers.call(
            tool.provider, tool.execute, call.arguments, request.principal, call_id
        )
    except NotSent as exc:
        await _record_read(state, authorized, existing, call_id, status="failed")
        raise ProviderUnavailable("the provider could not be reached", call_id=call_id) from exc
    except TooLarge as exc:
        await _record_read(state, authorized, existing, call_id, status="failed")
        raise ProviderUnavailable(gates.TOO_LARGE, call_id=call_id) from exc
    except Uncertain as exc:
        await _record_read(state, authorized, existing, call_id, status="failed")
        raise ProviderTimeout(
            "the provider did not answer in time", call_id=call_id, status="unknown"
        ) from exc
    status = classify(response.status)
    result = trimmed(tool, response.status, response.body)
    await _record_read(
        state,
        authorized,
        existing,
        call_id,
        status="failed" if status == "unknown" else status,  # a read has nothing to reconcile
        provider_status=response.status,
        result=result,
        provider_ms=response.elapsed_ms,
    )
    if status == "unknown":
        raise ProviderTimeout(
            "the provider did not give a usable answer", call_id=call_id, status="unknown"
        )
    endorsed = endorsement_list(authorized.decision, None)
    return result_body(call_id, None, status, response.status, result, endorsed)


async def _use_read_approval(
    state: Services,
    authorized: Authorized,
    existing: CallRow | None,
    call_id: str,
    approval_id: str | None,
    dry_run_id: str | None,
) -> None:
    """The read's approval, checked as a mutation's first call checks its own
    (``gates.valid_approval``) and used up with the call moved to executing, in one
    transaction; a refusal is recorded as the call's denial (a new call's, when the
    request named none)."""
    request, call = authorized.request, authorized.call
    try:
        approval = await gates.valid_approval(
            state.db, authorized, approval_id, existing.id if existing else None, dry_run_id
        )
        async with state.db.transaction() as conn:
            await store.set_state(conn, call_id, "executing")  # locks the call's row
            if not await approvals.consume(conn, approval.id, call_id, rules.quorum(call.tool)):
                raise ApprovalConsumed("the approval was used by another execution")
    except ToolgateError as error:
        await record_refusal(
            state.db, request, call, call_id, error, new_call=existing is None, deny_call=False
        )
        raise


async def _record_read(
    state: Services,
    authorized: Authorized,
    existing: CallRow | None,
    call_id: str,
    *,
    status: Finished,
    provider_status: int | None = None,
    result: Any = None,
    provider_ms: float | None = None,
) -> None:
    """A read's outcome: no execution record, just the call, its audit row and the run
    (``provider_status`` ``None``: the provider gave no answer)."""
    request, call = authorized.request, authorized.call
    row = call_row(request, call, call_id, authorized.decision, None, status)
    event = audit_event(
        request,
        call,
        "executed" if status == "succeeded" else "failed",
        call_id,
        decision="allow",
        authorized_by=row.authorized_by,
        outcome={"status": status, "provider_status": provider_status},
        provider_ms=provider_ms,
    )
    told = (
        run_outcome(request.run_id, call, call_id, status, result)
        if request.run_id is not None
        else None
    )
    if not request.catalog.subscribers(webhooks.CALL_EXECUTED) and not (told and told.heavy):
        await _write_call(state.db, existing, row, event, told)
    else:
        async with state.db.transaction() as conn:
            await _write_call(conn, existing, row, event, told)
            await webhooks.announce(
                conn,
                request.catalog,
                webhooks.CALL_EXECUTED,
                webhooks.call_data(row.id, row.tool, row.tenant, row.actor, row.run_id, row.state),
            )
    telemetry.decided(authorized, call_id, quiet=True)
    telemetry.executed(request.tool_name, call_id, status)


async def _write_call(
    conn: Writer, existing: CallRow | None, row: CallRow, event: AuditEvent, told: Told | None
) -> None:
    """The call as ``row`` says, new or moved to its state, with its audit row and what its
    result ``told`` its run: one statement."""
    if existing is None:
        await store.insert_with_audit(conn, row, event, told)
    else:  # from executing (a run's read marks its call started) to its outcome
        await store.set_state_with_audit(conn, row.id, row.state, event, keep=OUTCOMES, told=told)


async def _approved_elsewise(conn: Connection, call: CallRow, snapshot_hash: str) -> bool:
    """Whether ``call`` was approved on another preview than this one: its approval went
    stale, and the call awaits a decision on the new preview."""
    if call.state != "approved":
        return False
    standing = await approvals.standing(conn, call.id)
    return all(a.snapshot_hash != snapshot_hash for a in standing if a.decision == "approve")


async def dry_run(state: Services, principal: Principal, body: DryRunBody) -> Preview:
    """Preview a proposed call through the provider's ``dry_run`` endpoint, re-authorized."""
    existing = await visible_call(state.db, principal, body.call_id)
    if existing.arguments is None:
        raise InvalidRequest("a denied call cannot be previewed", call_id=existing.id)
    request = Request.under(
        state.catalog, principal, existing.tool, existing.arguments, existing.run_id
    )
    request = await with_run(state.db, request)
    if request.tool is not None and request.tool.dry_run is None:
        raise InvalidRequest(f"tool {request.tool.name!r} has no dry-run", call_id=existing.id)
    authorized = await authorize(state, request, existing.id, existing)
    call, tool = authorized.call, authorized.tool
    response = await gates.preview(state.providers, authorized, existing.id)
    snapshot_hash = digest(response.body)
    ttl_s = approval_window_s(tool)
    row = DryRunRow(
        id=new_id("dry"),
        call_id=existing.id,
        tenant=principal.tenant,
        actor=principal.sub,
        tool=tool.name,
        fingerprint=call.fingerprint,
        policy_version=request.catalog.policy_version,
        snapshot=response.body,
        snapshot_hash=snapshot_hash,
        expires_at=datetime.now(UTC) + timedelta(seconds=ttl_s),
    )
    next_step: Next = "approval" if authorized.decision.impact == "high" else "execute"
    async with state.db.transaction() as conn:
        await store.insert_dry_run(conn, row)
        await store.forget_old_dry_runs(conn, existing.id)
        stale = next_step == "approval" and await _approved_elsewise(conn, existing, snapshot_hash)
        moved = await store.set_state(
            conn,
            existing.id,
            "awaiting_approval" if next_step == "approval" else "previewed",
            unless=FINAL if stale else SETTLED,
            pending_until=row.expires_at if next_step == "approval" else None,
        )
        if moved and next_step == "approval" and existing.state != "awaiting_approval":
            await _announce_awaiting(conn, state.settings.public_url, request.catalog, existing)
        await append(
            conn,
            audit_event(
                request,
                call,
                "dry_run",
                existing.id,
                decision="allow",
                authorized_by=authorized_by(request),
                outcome={"dry_run_id": row.id, "snapshot_hash": snapshot_hash},
                provider_ms=response.elapsed_ms,
            ),
        )
    telemetry.decided(authorized, existing.id)
    return {
        "dry_run_id": row.id,
        "call_id": existing.id,
        "snapshot": response.body,
        "snapshot_hash": snapshot_hash,
        "expires_at": row.expires_at.isoformat(),
        "next": next_step,
    }


async def _announce_awaiting(
    conn: Connection, public_url: str | None, catalog: Catalog, call: CallRow
) -> None:
    """``approval.requested``: enough for a chat message (the call, tool, actor, target,
    impact and a link to the console's page for it), never an argument's value."""
    data = webhooks.call_data(
        call.id, call.tool, call.tenant, call.actor, call.run_id, "awaiting_approval"
    )
    link = webhooks.console_url(public_url, call.id)
    await webhooks.announce(
        conn,
        catalog,
        webhooks.APPROVAL_REQUESTED,
        data | {"target": call.target, "impact": call.impact, "console_url": link},
    )
