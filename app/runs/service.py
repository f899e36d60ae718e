"""Run budgets: creating runs, admitting each call against them, and ending them.

``admit`` runs inside the caller's transaction, before anything reaches a provider: either
the call is counted (and its cost charged) or the run ends — ``failed`` with the limit named,
or ``needs_clarification`` for a repeated failing call — and the caller records the call as
denied in that same transaction. Denied or pending calls never consume cost: cost is charged
only when an execution is about to be sent, and refunded if it certainly was not.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.auth.principal import Principal
from app.catalog.models import Catalog
from app.catalog.trusted import FieldPath
from app.db import Connection, Database, Writer
from app.errors import InvalidRequest, NotFound, RepeatedCall, RunLimitExceeded, ToolgateError
from app.ids import new_id
from app.runs import endorsement, provenance, store
from app.runs.models import (
    SERVER_MAXIMA,
    FinishBody,
    Run,
    RunBody,
    RunCreated,
    RunRow,
    ScopeBody,
)
from app.webhooks import store as webhooks


async def create(db: Database, principal: Principal, body: RunBody) -> RunCreated:
    requested = body.limits.model_dump()
    limits = {
        name: min(requested[name], cap) if requested[name] is not None else cap
        for name, cap in SERVER_MAXIMA.items()
    }
    run = RunRow(
        id=new_id("run"),
        tenant=principal.tenant,
        actor=principal.sub,
        task=body.task,
        status="active",
        recoverable=None,
        reason=None,
        limit_name=None,
        max_calls=int(limits["max_calls"]),
        max_seconds=int(limits["max_seconds"]),
        max_cost=float(limits["max_cost"]),
        max_repeats=int(limits["max_repeats"]),
        max_failures=int(limits["max_failures"]),
        task_form=endorsement.formed([body.task]) if body.task else None,
        scope_tools=list(dict.fromkeys(body.scope.tools)) if body.scope else None,
        scope_outside=body.scope.outside if body.scope else None,
    )
    async with db.transaction() as conn:
        await store.insert(conn, run)
    return {"run_id": run.id, "status": "active", "limits": run.limits, "scope": run.scope}


async def narrow(
    db: Database, catalog: Catalog, principal: Principal, run_id: str, body: ScopeBody
) -> Run:
    """Narrow the run's scope: a subset of its tools (any, when it had no scope), and
    ``approve`` may become ``deny``; anything wider is refused."""
    wanted = body.scope
    async with db.transaction() as conn:
        run = await visible(conn, principal, run_id, lock=True)
        if run.scope_tools is not None:
            wider = sorted(set(wanted.tools) - set(run.scope_tools))
            if wider:
                raise InvalidRequest(
                    "a run's scope can only be narrowed: not in it " + ", ".join(wider),
                    run_id=run.id,
                )
            if run.scope_outside == "deny" and wanted.outside == "approve":
                raise InvalidRequest(
                    "a run's scope can only be narrowed: outside: deny stays deny", run_id=run.id
                )
        await store.set_scope(conn, run.id, list(dict.fromkeys(wanted.tools)), wanted.outside)
    return await read(db, catalog, principal, run_id)


async def visible(
    conn: Connection, principal: Principal, run_id: str, *, lock: bool = False
) -> RunRow:
    """The principal's own run; anyone else's is indistinguishable from a missing one.
    ``lock`` it to decide on it: a finish or admission committed meanwhile is then seen,
    never answered as a limit the run did not reach."""
    run = await store.get(conn, run_id, lock=lock)
    if run is None or (run.tenant, run.actor) != (principal.tenant, principal.sub):
        raise NotFound("no such run")
    return run


class OwnRuns:
    """The runs this process has found to be whose, the latest ``size`` of them (the first
    forgotten first). A run's owner never changes: a user's later read in a run known to be
    theirs is decided before the run is read (its scope judged where the call is admitted),
    while a run id not known to be the caller's is read first, so that nothing is asked of a
    provider for a run that is not theirs. Pure: it holds what it is told."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._owners: dict[str, tuple[str, str]] = {}

    def owns(self, principal: Principal, run_id: str) -> bool:
        return self._owners.get(run_id) == (principal.tenant, principal.sub)

    def saw(self, run: RunRow) -> None:
        if run.id not in self._owners:
            if len(self._owners) >= self._size:
                del self._owners[next(iter(self._owners))]
            self._owners[run.id] = (run.tenant, run.actor)


async def admit_at_once(
    writer: Writer,
    principal: Principal,
    run_id: str,
    fingerprint: str | None,
    *,
    new_call: bool,
    cost: float,
    within: str | None = None,
) -> bool:
    """Count the call against the principal's own run in one statement when nothing stands
    in the way (``store.admit_at_once``; ``within``: a tool the run's scope must hold, for a
    call decided before its run was read): in the caller's transaction, or on its own,
    committed with concurrent ones. ``False``: ``admit`` decides, on the locked run."""
    return await store.admit_at_once(
        writer, run_id, principal.tenant, principal.sub, fingerprint, int(new_call), cost, within
    )


async def admit(
    conn: Connection,
    principal: Principal,
    run_id: str,
    fingerprint: str | None,
    catalog: Catalog,
    *,
    new_call: bool,
    cost: float,
) -> ToolgateError | None:
    """Count one call against the run in the caller's transaction, or end the run and return
    the 429 the caller must record as this call's denial and then answer. The common case,
    nothing in the way, is one statement; anything else is decided on the locked run."""
    calls = int(new_call)
    if await admit_at_once(conn, principal, run_id, fingerprint, new_call=new_call, cost=cost):
        return None
    run = await visible(conn, principal, run_id, lock=True)
    if run.status != "active":
        return RunLimitExceeded(
            f"the run has ended ({run.status})",
            run_id=run.id,
            run_status=run.status,
            limit=run.limit_name,
            recoverable=bool(run.recoverable),
        )
    if (
        fingerprint is not None
        and await store.repeats(conn, run.id, fingerprint) >= run.max_repeats
    ):
        reason = f"the same call failed or came back empty {run.max_repeats} times"
        await _end(conn, catalog, run, "needs_clarification", reason)
        return RepeatedCall(reason, run_id=run.id, run_status="needs_clarification")
    if await store.admit(conn, run.id, calls, cost):
        return None
    limit = await _fail(conn, catalog, run, calls, cost)
    return RunLimitExceeded(
        f"the run's {limit} is reached",
        run_id=run.id,
        run_status="failed",
        limit=limit,
        recoverable=True,
    )


async def _end(
    conn: Connection,
    catalog: Catalog,
    run: RunRow,
    status: str,
    reason: str | None,
    *,
    recoverable: bool | None = None,
    limit_name: str | None = None,
) -> bool:
    """End an active run, announced in the same transaction; ``False`` when it had already
    ended."""
    if not await store.finish(
        conn, run.id, status, reason, recoverable=recoverable, limit_name=limit_name
    ):
        return False
    data = {"run_id": run.id, "tenant": run.tenant, "actor": run.actor, "status": status}
    await webhooks.announce(conn, catalog, webhooks.RUN_ENDED, {**data, "reason": reason})
    return True


async def _fail(conn: Connection, catalog: Catalog, run: RunRow, calls: int, cost: float) -> str:
    """End the run ``failed``, recoverably, naming the limit that refused ``calls`` more
    calls at ``cost``; that limit."""
    limit = _exceeded(run, calls, cost)
    reason = f"{limit} reached"
    await _end(conn, catalog, run, "failed", reason, recoverable=True, limit_name=limit)
    return limit


def _spent(run: RunRow) -> bool:
    """Whether an active run can admit no call at all any more: its time is up or its
    failures are at their limit. It has ended, though no call was refused yet to say so."""
    return run.status == "active" and (_outlived(run) or run.failures >= run.max_failures)


def _outlived(run: RunRow) -> bool:
    assert run.created_at is not None
    return datetime.now(UTC) > run.created_at + timedelta(seconds=run.max_seconds)


async def _settled(db: Database, catalog: Catalog, principal: Principal, run_id: str) -> RunRow:
    """The run, ended ``failed`` first if it is spent: a run is read (and finished) as what
    the next call would find, never ``active`` past a limit because nobody called since."""
    async with db.transaction() as conn:
        run = await visible(conn, principal, run_id, lock=True)
        if not _spent(run):
            return run
        await _fail(conn, catalog, run, 0, 0.0)
        return await visible(conn, principal, run_id)


def _exceeded(run: RunRow, calls: int, cost: float) -> str:
    """Which limit refused the call (as seen just before; the UPDATE was the real judge)."""
    if _outlived(run):
        return "max_seconds"
    if run.failures >= run.max_failures:
        return "max_failures"
    if run.calls + calls > run.max_calls:
        return "max_calls"
    return "max_cost" if run.cost + cost > run.max_cost else "max_calls"


async def refund(conn: Connection, run_id: str, cost: float) -> None:
    await store.refund(conn, run_id, cost)


async def count_denied(conn: Connection, run_id: str) -> None:
    await store.count_call(conn, run_id)


def told(
    run_id: str,
    fingerprint: str,
    call_id: str,
    status: str,
    result: Any,
    *,
    trusted: tuple[FieldPath, ...],
    arguments: Any,
    counted: bool = True,
) -> store.Told:
    """What a result tells its run (``store.telling``): if ``counted``, a failure or an empty
    result for its counters; and its strings (``endorsement.told``)."""
    succeeded = status == "succeeded"
    vouched, found = endorsement.told(result, trusted, arguments, succeeded)
    return store.Told(
        run_id=run_id,
        fingerprint=fingerprint,
        failed=counted and not succeeded,
        empty=counted and result in (None, {}, [], ""),
        windows=sorted(found) if found else None,
        call_id=call_id,
        overflow=found is None,
        trusted=vouched,
        most_windows=provenance.MAX_WINDOWS,
        most_trusted=endorsement.MAX_TRUSTED_CHARS,
    )


async def tell(writer: Writer, result: store.Told) -> None:
    """Store what ``result`` tells its run (``told``): in the caller's transaction, the
    one that records the result, or committed with concurrent ones."""
    await store.tell(writer, result)


async def recall(
    conn: Connection, run_id: str, candidates: list[provenance.Candidate]
) -> provenance.Recall:
    """What the run remembers of these candidate arguments, and its task."""
    wanted = list({w for candidate in candidates for w in candidate.windows})
    task, forgotten_after, found = await store.recall(conn, run_id, wanted)
    return provenance.Recall(task, found, forgotten_after)


async def read(db: Database, catalog: Catalog, principal: Principal, run_id: str) -> Run:
    async with db.connection() as conn:
        run = await visible(conn, principal, run_id)
        waiting = await store.awaiting_approval(conn, run.id)
        calls = await store.calls_of(conn, run.id)
    if _spent(run):
        run = await _settled(db, catalog, principal, run_id)
    status = "awaiting_approval" if run.status == "active" and waiting else run.status
    body: Run = {
        "run_id": run.id,
        "task": run.task,
        "scope": run.scope,
        "status": status,
        "limits": run.limits,
        "counters": {
            "calls": run.calls,
            "cost": run.cost,
            "failures": run.failures,
            "seconds": _elapsed(run),
        },
        "calls": calls,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }
    if run.status != "active":
        body["reason"] = run.reason
        body["recoverable"] = run.recoverable
        body["limit"] = run.limit_name
    return body


def _elapsed(run: RunRow) -> float:
    assert run.created_at is not None
    end = run.finished_at or datetime.now(UTC)
    return round((end - run.created_at).total_seconds(), 3)


async def finish(
    db: Database, catalog: Catalog, principal: Principal, run_id: str, body: FinishBody
) -> Run:
    async with db.transaction() as conn:
        run = await visible(conn, principal, run_id, lock=True)
        ended: str | None = run.status
        if _spent(run):  # ended by its limit first, as the next call would have found it
            await _fail(conn, catalog, run, 0, 0.0)
            ended = "failed"
        elif await _end(conn, catalog, run, body.status, body.reason):
            ended = None
    if ended is not None:  # raised once the limit's ending is committed
        raise InvalidRequest(f"the run has already ended ({ended})", run_id=run.id)
    return await read(db, catalog, principal, run_id)
