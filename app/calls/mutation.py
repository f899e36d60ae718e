"""Executing a mutation exactly once (docs/api.md, POST /execute and execution records).

PostgreSQL decides: the ``(tenant, actor, key)`` claim is unique and the approval is
consumed by a conditional update, both in one transaction; outcomes move records only out of
open states. The Redis lock merely keeps two instances from working on one key at once. A
retry that finds an open record whose worker is gone (its lock lapsed) reconciles it with
the provider instead of repeating it, and the provider deduplicates on the operation id.
Commits on the happy path: the claim, then the outcome with its audit row.

Once a request may have reached the provider, the answer is never "nothing ran": any
uncertainty, including a database that fails while the outcome is being stored, is a 504
naming the operation. A record whose outcome could not be stored stays open, and the
background reconciler (``reconciler``) resolves it through ``OpenExecution.ask``.

Two objects: an ``Execution`` is one authorized request on its key (claim, replay, resume,
send); an ``OpenExecution`` is a claimed record whose outcome is still to be stored (ask the
provider, finish, mark unknown). Only an ``Execution`` sends, so the reconciler, which has a
record but no verified request, can ask about an operation but never perform one.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from app import evidence, telemetry
from app.audit.store import AuditEvent, append
from app.calls import answers, exactly_once, gates, gating, recording, store
from app.calls.models import Answer, Authorized, CallRow, ExecutionRow, Request
from app.calls.policy import PreparedCall
from app.calls.results import classify, result_body, trimmed
from app.calls.services import Services
from app.calls.states import Finished
from app.catalog.models import Tool
from app.consent import rules
from app.consent import store as approvals
from app.consent.models import ApprovalRow
from app.errors import (
    ApprovalConsumed,
    ApprovalRejected,
    IdempotencyInFlight,
    ProviderTimeout,
    ProviderUnavailable,
    ToolgateError,
    Unavailable,
)
from app.ids import new_id
from app.outbound import NotSent, Response, Uncertain
from app.runs import service as runs
from app.webhooks import store as webhooks

LOCK_MARGIN_S = 5.0
REPLAYED = {"Idempotent-Replayed": "true"}
log = logging.getLogger("toolgate")


def lock_name(tenant: str, actor: str, key: str) -> str:
    """The Redis lock a request on this key holds while it works on the key's record."""
    return "idem:" + hashlib.sha256(f"{tenant}\0{actor}\0{key}".encode()).hexdigest()


def lock_ttl(tool: Tool) -> float:
    """Longer than its holder may wait on the provider: a lapsed lock means its holder is
    gone. A holder asks up to twice in a row, each up to the timeout (a first call rechecks
    the approved preview and then sends; a resumed one asks ``reconcile`` and then sends),
    and a lock lapsed during the second would let a retry send the operation again."""
    return 2 * tool.provider.timeout_s + LOCK_MARGIN_S


def replayed(response: answers.Execution) -> Answer:
    return Answer({**response, "replayed": True}, REPLAYED)


class OpenExecution:
    """A claimed execution record whose outcome is not stored yet, with what storing it
    needs: the request it is recorded under (actor, tenant, run, catalog) and the call
    (tool, arguments, fingerprint, target). A client's retry and the background reconciler
    both resolve records through here."""

    __slots__ = ("call", "endorsement", "record", "request", "state")

    def __init__(
        self,
        state: Services,
        request: Request,
        call: PreparedCall,
        record: ExecutionRow,
        endorsement: list[evidence.EndorsementItem] | None = None,
    ) -> None:
        self.state, self.request, self.call, self.record = state, request, call, record
        self.endorsement = endorsement
        """What endorsed the call's ``x-endorsed`` arguments, for its answer (a record the
        background reconciler resolves has no decision to tell)."""

    async def ask(self) -> Answer | None:
        """Ask the tool's ``reconcile`` endpoint what became of the operation, and store a
        finished outcome exactly as a first send would have (what replays answer from then
        on). ``None`` when the tool has no such endpoint or the provider never saw the
        operation. No usable answer: the record is marked unknown and ``ProviderTimeout``
        raised."""
        tool, record = self.call.tool, self.record
        if tool.reconcile is None:
            return None
        try:
            response = await self.state.providers.call(
                tool.provider,
                tool.reconcile,
                {"operation_id": record.operation_id},
                self.request.principal,
                record.call_id,
            )
        except (NotSent, Uncertain) as exc:
            await self.mark_unknown()
            raise self.timeout() from exc
        said = exactly_once.reconciled(response.status, response.body)
        if said == "never":
            return None
        if said == "unknown":
            await self.mark_unknown()
            raise self.timeout()
        outcome = Response(said.provider_status, said.result, response.elapsed_ms)
        return await self.finish(outcome, said.status, "reconciled")

    async def finish(self, response: Response, status: Finished, event: str) -> Answer:
        """Finish the record with the provider's answer and its audit row. The provider has
        acted: if the database fails now, the answer is still the 504 of an unknown outcome,
        and the record, still open, is left to reconciliation."""
        request, record = self.request, self.record
        answer = result_body(
            record.call_id,
            record.operation_id,
            status,
            response.status,
            trimmed(self.call.tool, response.status, response.body),
            self.endorsement,
        )
        audit = self._event(
            event,
            authorized_by=recording.authorized_by(request),
            outcome={
                "status": status,
                "provider_status": response.status,
                "operation_id": record.operation_id,
            },
            provider_ms=response.elapsed_ms,
        )
        args = (record.operation_id, status, response.status, answer, audit)
        first: ExecutionRow | None = None
        try:
            if request.run_id is None and not request.catalog.subscribers(
                webhooks.CALL_EXECUTED
            ):  # one statement: atomic by itself
                changed = await store.finish(self.state.db, *args)
            else:
                async with self.state.db.transaction() as conn:
                    changed = await store.finish(conn, *args)
                    if changed:
                        await recording.record_run_outcome(
                            conn, request, self.call, record.call_id, status, answer["result"]
                        )
                        await webhooks.announce(
                            conn,
                            request.catalog,
                            webhooks.CALL_EXECUTED,
                            webhooks.call_data(
                                record.call_id,
                                record.tool,
                                record.tenant,
                                record.actor,
                                request.run_id,
                                status,
                            ),
                        )
            if not changed:  # another worker (whose lock had lapsed) recorded it first
                async with self.state.db.connection() as conn:
                    first = await store.get_execution(
                        conn, record.tenant, record.actor, record.idempotency_key
                    )
        except Unavailable as exc:
            self._unrecorded(status)
            raise self.timeout() from exc
        if not changed:
            if first is None or first.response is None:
                raise self.timeout()
            return replayed(first.response)
        telemetry.executed(record.tool, record.call_id, status)
        return Answer(answer)

    async def mark_unknown(self, provider_status: int | None = None) -> None:
        """The provider may have acted: keep the record open as ``unknown`` for
        reconciliation. Only the move out of ``in_flight`` is news, audited and counted once;
        a record already unknown stays as it is. When the database is unavailable the record
        stays in flight (the reconciler's to resolve) and the caller still answers with
        ``timeout``."""
        record = self.record
        event = self._event(
            "failed",
            code="provider_timeout",
            reason="outcome unknown until reconciled",
            outcome={
                "status": "unknown",
                "provider_status": provider_status,
                "operation_id": record.operation_id,
            },
        )
        try:
            async with self.state.db.transaction() as conn:
                changed = await store.finish(
                    conn, record.operation_id, "unknown", provider_status, None, event
                )
                if changed:
                    await recording.record_run_outcome(
                        conn, self.request, self.call, record.call_id, "unknown", None
                    )
        except Unavailable:
            self._unrecorded("unknown")
            return
        if changed:
            telemetry.executed(record.tool, record.call_id, "unknown")

    def timeout(self) -> ToolgateError:
        return ProviderTimeout(
            "the provider's outcome is unknown; retry with the same Idempotency-Key to reconcile",
            call_id=self.record.call_id,
            operation_id=self.record.operation_id,
            status="unknown",
        )

    def _event(self, event: str, **fields: Any) -> AuditEvent:
        return recording.audit_event(
            self.request,
            self.call,
            event,
            self.record.call_id,
            decision="allow",
            approval_id=self.record.approval_id,
            **fields,
        )

    def _unrecorded(self, status: str) -> None:
        log.warning(
            "outcome %s of operation %s not recorded: database unavailable; left to reconciliation",
            status,
            self.record.operation_id,
        )


class Execution:
    """One authorized mutation request on its idempotency key. ``run`` takes the key's lock
    and then, depending on the key's record: claims it for a first call and sends, replays a
    finished record, or resumes an open one whose worker is gone."""

    __slots__ = (
        "approval",
        "approval_id",
        "authorized",
        "call_id",
        "dry_run_id",
        "existing",
        "gates",
        "key",
        "rechecked",
        "state",
    )

    def __init__(
        self,
        state: Services,
        authorized: Authorized,
        key: str,
        existing: CallRow | None,
        approval_id: str | None,
        dry_run_id: str | None,
    ) -> None:
        self.state, self.authorized, self.key, self.existing = state, authorized, key, existing
        self.approval_id, self.dry_run_id = approval_id, dry_run_id
        self.gates = gating.needed(
            gating.Gated(
                authorized.decision, authorized.tool, authorized.run_id, existing is not None
            )
        )
        """The gates a first call must pass (``gating``), decided once: the fast claim and
        the checks both read them."""
        self.call_id = existing.id if existing else None
        self.approval: ApprovalRow | None = None
        self.rechecked: AuditEvent | None = None

    async def run(self) -> Answer:
        principal = self.authorized.principal
        lock = lock_name(principal.tenant, principal.sub, self.key)
        async with self.state.locks.hold(lock, lock_ttl(self.authorized.tool)) as held:
            if not held:
                raise IdempotencyInFlight("the original request with this key is still running")
            if not self.gates:
                answer = await self._claim_ungated()
                if answer is not None:
                    return answer
            record = await self._record()
            call = self.authorized.call
            holds = record and exactly_once.Held(record.tool, record.fingerprint, record.state)
            step = exactly_once.step(holds, call.tool.name, call.fingerprint)
            if record is None or step == "first":
                return await self._first_call()
            if step == "replay":
                return await self._replay(record)
            return await self._resume(record)

    async def _claim_ungated(self) -> Answer | None:
        """Claim the key and record the new call in one statement, then send; ``None`` when
        the key is taken (its record decides: replay, resume or a reused key). A fresh key,
        the usual case, costs no read of its record."""
        authorized = self.authorized
        record = self._new_record(new_id("call"), None)
        row = recording.call_row(
            authorized.request,
            authorized.call,
            record.call_id,
            authorized.decision,
            None,
            "executing",
        )
        if not await store.claim(self.state.db, record, row):
            return None
        telemetry.decided(authorized, record.call_id, quiet=True)
        return await self._send(record, resumed=False)

    def _new_record(self, call_id: str, approval_id: str | None) -> ExecutionRow:
        """The in-flight record a first call claims its key with."""
        call, principal = self.authorized.call, self.authorized.principal
        return ExecutionRow(
            operation_id=new_id("op"),
            tenant=principal.tenant,
            actor=principal.sub,
            idempotency_key=self.key,
            call_id=call_id,
            tool=call.tool.name,
            target_type=call.target.type if call.target else None,
            target_id=call.target.id if call.target else None,
            fingerprint=call.fingerprint,
            approval_id=approval_id,
            state="in_flight",
            provider_status=None,
            response=None,
            expires_at=datetime.now(UTC) + timedelta(seconds=self.state.settings.idempotency_ttl_s),
        )

    async def _record(self) -> ExecutionRow | None:
        """This actor's record for the key."""
        principal = self.authorized.principal
        async with self.state.db.connection() as conn:
            return await store.get_execution(conn, principal.tenant, principal.sub, self.key)

    async def _replay(self, record: ExecutionRow) -> Answer:
        """The stored answer again. Replayed to a call of a run, it is a result that run is
        told (the key may have been first used in another run, or none): the run remembers
        its strings, as it would have on the first send (a run remembering them already adds
        nothing)."""
        assert record.response is not None  # a finished record stores its answer
        authorized = self.authorized
        result = record.response.get("result")
        async with self.state.db.transaction() as conn:
            if authorized.run_id is not None:
                await recording.remember_result(
                    conn, authorized.run_id, authorized.call, record.call_id, record.state, result
                )
            await append(
                conn,
                recording.audit_event(
                    authorized.request,
                    authorized.call,
                    "replayed",
                    record.call_id,
                    decision="allow",
                    approval_id=record.approval_id,
                    outcome={"status": record.state, "operation_id": record.operation_id},
                ),
            )
        telemetry.decided(authorized, record.call_id, quiet=True)
        telemetry.executed(record.tool, record.call_id, "replayed")
        return replayed(record.response)

    async def _first_call(self) -> Answer:
        """Pass the gates this call needs (``self.gates``, each checked by ``CHECKS``), then
        claim the key and consume the approval in one transaction, and send. A refusal of a
        recorded kind (``ToolgateError.recorded``) is recorded as the call's denial."""
        authorized, existing = self.authorized, self.existing
        request, call, tool = authorized.request, authorized.call, authorized.tool
        try:
            for gate in self.gates:
                await CHECKS[gate](self)
        except ToolgateError as error:
            await recording.record_refusal(
                self.state.db,
                request,
                call,
                self.call_id or new_id("call"),
                error,
                new_call=self.call_id is None,
                deny_call=False,
                taint=authorized.decision.taint,
            )
            raise
        approval, rechecked = self.approval, self.rechecked
        call_id = self.call_id or new_id("call")
        record = self._new_record(call_id, approval.id if approval else None)
        new_call = existing is None and approval is None
        try:
            async with self.state.db.transaction() as conn:
                counted = await recording.counts_as_call(conn, existing)  # call, then run
                if existing is None and approval is not None:  # its call, by approval alone
                    await store.lock(conn, call_id)
                refusal = await recording.admit_to_run(
                    conn, authorized, new_call=approval is None and counted, cost=tool.cost
                )
                if refusal is not None:
                    await recording.write_denial(
                        conn, request, call, call_id, refusal, new_call=new_call, deny_call=False
                    )
                else:
                    if new_call:
                        row = recording.call_row(
                            request, call, call_id, authorized.decision, None, "executing"
                        )
                        claimed = await store.claim(conn, record, row)
                    else:
                        await store.set_state(conn, call_id, "executing")
                        claimed = await store.claim(conn, record)
                    if not claimed:
                        raise IdempotencyInFlight(
                            "the original request with this key is still running"
                        )
                    if approval is not None and not await approvals.consume(
                        conn, approval.id, record.operation_id, rules.quorum(call.tool)
                    ):
                        raise ApprovalConsumed("the approval was used by another execution")
                    if rechecked is not None:
                        await append(conn, rechecked)
        except ApprovalConsumed as error:  # lost the race for it: rolled back, and recorded
            async with self.state.db.transaction() as conn:
                await recording.write_denial(
                    conn, request, call, call_id, error, new_call=False, deny_call=False
                )
            raise
        if refusal is not None:
            raise refusal
        telemetry.decided(authorized, call_id, quiet=True)
        return await self._send(record, resumed=False)

    async def _same_call(self) -> None:
        """The named call, as it was proposed, and not rejected."""
        existing = self.existing
        assert existing is not None  # the gate applies only to a named call
        gates.check_same_call(existing, self.authorized.call)
        if existing.state == "rejected":
            raise ApprovalRejected("the approver rejected this call; the rejection is final")

    async def _approval(self) -> None:
        """A valid approval of this request, and (``approval.recheck``) a preview that still
        shows what it was given on; the approval names the call when the request did not."""
        authorized = self.authorized
        approval = await gates.valid_approval(
            self.state.db, authorized, self.approval_id, self.call_id, self.dry_run_id
        )
        self.call_id = self.call_id or approval.call_id
        if authorized.tool.recheck and approval.snapshot_hash is not None:
            preview = await gates.recheck(self.state.db, self.state.providers, authorized, approval)
            self.rechecked = self._rechecked(approval, preview)
        self.approval = approval

    async def _dry_run(self) -> None:
        await gates.require_dry_run(self.state.db, self.authorized, self.dry_run_id)

    async def _run(self) -> None:
        """Nothing to read before the claim: the run admits the call in the claim's own
        transaction (``recording.admit_to_run``), which the fast claim does not open."""

    def _rechecked(self, approval: ApprovalRow, preview: Response) -> AuditEvent:
        """The audit row of a recheck that found the approved preview unchanged (a changed
        one is the ``approval_stale`` denial, with both hashes)."""
        authorized = self.authorized
        return recording.audit_event(
            authorized.request,
            authorized.call,
            "dry_run",
            approval.call_id,
            decision="allow",
            reason="recheck: the preview is as approved",
            approval_id=approval.id,
            authorized_by=recording.authorized_by(authorized.request),
            outcome={"recheck": "unchanged", "snapshot_hash": approval.snapshot_hash},
            provider_ms=preview.elapsed_ms,
        )

    async def _resume(self, record: ExecutionRow) -> Answer:
        """An open record whose worker is gone: ask the provider what happened before
        acting; re-send (with the same operation id) only when it cannot say or never saw
        it."""
        telemetry.decided(self.authorized, record.call_id)
        answer = await self._opened(record).ask()
        if answer is None:
            return await self._send(record, resumed=True)
        return answer

    def _opened(self, record: ExecutionRow) -> OpenExecution:
        authorized = self.authorized
        endorsement = recording.endorsement_list(authorized.decision, None)
        return OpenExecution(self.state, authorized.request, authorized.call, record, endorsement)

    async def _send(self, record: ExecutionRow, *, resumed: bool) -> Answer:
        """Forward with the operation id as the provider's Idempotency-Key; store the
        outcome."""
        call, opened = self.authorized.call, self._opened(record)
        response: Response | None = None
        failure: BaseException | None = None
        try:
            response = await self.state.providers.call(
                call.tool.provider,
                call.tool.execute,
                call.arguments,
                self.authorized.principal,
                record.call_id,
                operation_id=record.operation_id,
            )
            sent: exactly_once.Sent = response.status
        except NotSent as exc:
            sent, failure = "not_sent", exc
        except Uncertain as exc:
            sent, failure = "uncertain", exc
        after = exactly_once.after_send(sent, resumed=resumed)
        if after == "release" and await self._release(record):
            raise ProviderUnavailable(
                "the provider could not be reached; nothing ran", call_id=record.call_id
            ) from failure
        if after != "finish" or response is None:  # unknown, or a release another took over
            await opened.mark_unknown(response.status if response else None)
            raise opened.timeout() from failure
        status = classify(response.status)
        assert status != "unknown"  # after_send finishes only a 2xx or 4xx
        event = "executed" if status == "succeeded" else "failed"
        return await opened.finish(response, status, "reconciled" if resumed else event)

    async def _release(self, record: ExecutionRow) -> bool:
        """Nothing reached the provider: free the key, give the approval and the run's cost
        back; whether the record was still this request's to release. One that another
        request took over meanwhile (it found the lock lapsed) is left as that one left
        it, and so are the approval and the run it holds: it may have sent since. The call's
        row is locked first, as an execute's admission locks it (call, then run): taking the
        run first deadlocked with a parallel execute of the same call."""
        authorized = self.authorized
        async with self.state.db.transaction() as conn:
            await store.lock(conn, record.call_id)
            if not await store.release(conn, record.operation_id):
                return False
            if record.approval_id is not None:
                await approvals.release(conn, record.approval_id, record.operation_id)
            if authorized.run_id is not None:
                await runs.refund(conn, authorized.run_id, authorized.tool.cost)
            await store.set_state(
                conn, record.call_id, "approved" if record.approval_id else "proposed"
            )
            await append(
                conn,
                recording.audit_event(
                    authorized.request,
                    authorized.call,
                    "failed",
                    record.call_id,
                    decision="allow",
                    code="provider_unavailable",
                    reason="provider unreachable; nothing ran",
                    approval_id=record.approval_id,
                ),
            )
        telemetry.executed(record.tool, record.call_id, "failed")
        return True


CHECKS: dict[str, Callable[[Execution], Awaitable[None]]] = {
    "same_call": Execution._same_call,
    "approval": Execution._approval,
    "dry_run": Execution._dry_run,
    "run": Execution._run,
}
"""Each gate's check (``gating.GATES``), by name; a check may leave what the claim needs on
the execution (the approval, the recheck's audit row, the call it names)."""
