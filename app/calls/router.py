"""HTTP for /propose, /dry-run, /execute and a call's history: parse, call the service, return.

The three decision endpoints are ``DecisionRoute``s (``app.routing``): FastAPI routes whose
signature is bound once, so a read pays for no per-request dependency solving."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from app.calls import history, service
from app.calls.models import DryRunBody, ExecuteBody, IdempotencyKey, ProposeBody
from app.deps import CurrentPrincipal, State
from app.responses import JSON
from app.routing import DecisionRoute

decisions = APIRouter(route_class=DecisionRoute)
router = APIRouter()


@decisions.post("/propose")
async def propose(principal: CurrentPrincipal, state: State, body: ProposeBody) -> JSON:
    return JSON(await service.propose(state, principal, body))


@decisions.post("/dry-run")
async def dry_run(principal: CurrentPrincipal, state: State, body: DryRunBody) -> JSON:
    return JSON(await service.dry_run(state, principal, body))


@decisions.post("/execute")
async def execute(
    principal: CurrentPrincipal,
    state: State,
    body: ExecuteBody,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSON:
    """``Idempotency-Key`` is required for a mutation (checked once it is authorized)."""
    key = IdempotencyKey.parse(idempotency_key)
    outcome = await service.execute(state, principal, body, key)
    return JSON(outcome.body, headers=outcome.headers)


@router.get("/calls/{call_id}")
async def call_history(
    call_id: str, principal: CurrentPrincipal, state: State, wait: float | None = None
) -> JSON:
    """``wait=S``: answer once the call leaves a waiting state, or after S seconds."""
    return JSON(await history.history_after(state, principal, call_id, wait))
