"""HTTP for /propose, /dry-run, /execute and a call's history: parse, call the service, return.

The three decision endpoints are ``DecisionRoute``s (``app.routing``): FastAPI routes whose
signature is bound once, so a read pays for no per-request dependency solving."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query

from app import errors
from app.calls import history, service, waiting
from app.calls.answers import CallHistory, Execution, Preview, Proposal
from app.calls.models import (
    IDEMPOTENCY_KEY_PATTERN,
    DryRunBody,
    ExecuteBody,
    IdempotencyKey,
    ProposeBody,
)
from app.deps import AUTHENTICATED, CurrentPrincipal, PathId, State
from app.responses import JSON, problems
from app.routing import DecisionRoute, operation_id

decisions = APIRouter(route_class=DecisionRoute, generate_unique_id_function=operation_id)
router = APIRouter()

AUTHORIZED = (
    *AUTHENTICATED,
    errors.ContentTooLarge,
    errors.ToolForbidden,
    errors.IdentitySpoof,
    errors.UnknownTool,
    errors.NotFound,
    errors.InvalidArguments,
    errors.TaintedArguments,
    errors.UnendorsedArguments,
    errors.OutOfScope,
    errors.ProviderUnavailable,
)
"""What authorizing a call may answer: its refusals, an unknown call or run, and an owner
lookup that could not be made."""
RUN_LIMITS = (errors.RunLimitExceeded, errors.RepeatedCall)
GATED = (
    errors.ApprovalRequired,
    errors.ApprovalExpired,
    errors.ApprovalRejected,
    errors.ApprovalMismatch,
    errors.ApprovalConsumed,
    errors.ApprovalStale,
    errors.DryRunRequired,
)


@decisions.post("/propose", response_model=Proposal, responses=problems(*AUTHORIZED, *RUN_LIMITS))
async def propose(principal: CurrentPrincipal, state: State, body: ProposeBody) -> JSON:
    return JSON(await service.propose(state, principal, body))


@decisions.post(
    "/dry-run", response_model=Preview, responses=problems(*AUTHORIZED, errors.ProviderTimeout)
)
async def dry_run(principal: CurrentPrincipal, state: State, body: DryRunBody) -> JSON:
    return JSON(await service.dry_run(state, principal, body))


@decisions.post(
    "/execute",
    response_model=Execution,
    responses=problems(
        *AUTHORIZED,
        *RUN_LIMITS,
        *GATED,
        errors.IdempotencyKeyMissing,
        errors.IdempotencyKeyInvalid,
        errors.IdempotencyKeyReused,
        errors.IdempotencyInFlight,
        errors.ProviderTimeout,
    ),
)
async def execute(
    principal: CurrentPrincipal,
    state: State,
    body: ExecuteBody,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", pattern=IDEMPOTENCY_KEY_PATTERN)
    ] = None,
) -> JSON:
    """``Idempotency-Key`` is required for a mutation (checked once it is authorized)."""
    key = IdempotencyKey.parse(idempotency_key)
    outcome = await service.execute(state, principal, body, key)
    return JSON(outcome.body, headers=outcome.headers)


@router.get(
    "/calls/{call_id}",
    response_model=CallHistory,
    responses=problems(*AUTHENTICATED, errors.NotFound),
)
async def call_history(
    call_id: PathId,
    principal: CurrentPrincipal,
    state: State,
    wait: Annotated[float | None, Query(gt=0, le=waiting.MAX_WAIT_S)] = None,
) -> JSON:
    """``wait=S``: answer once the call leaves a waiting state, or after S seconds."""
    return JSON(await history.history_after(state, principal, call_id, wait))
