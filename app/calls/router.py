"""HTTP for /propose, /dry-run and /execute: parse, call the service, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from app.calls import history, service
from app.calls.models import DryRunBody, ExecuteBody, ProposeBody
from app.deps import CurrentPrincipal, State
from app.responses import JSON

router = APIRouter()


@router.post("/propose")
async def propose(body: ProposeBody, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await service.propose(state, principal, body))


@router.post("/dry-run")
async def dry_run(body: DryRunBody, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await service.dry_run(state, principal, body))


@router.post("/execute")
async def execute(
    body: ExecuteBody,
    principal: CurrentPrincipal,
    state: State,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> JSON:
    outcome = await service.execute(state, principal, body, idempotency_key)
    return JSON(outcome.body, headers=outcome.headers)


@router.get("/calls/{call_id}")
async def call_history(call_id: str, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await history.history(state, principal, call_id))
