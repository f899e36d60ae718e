"""HTTP for /propose and /execute: parse, call the service, return."""

from __future__ import annotations

from fastapi import APIRouter

from app.calls import service
from app.calls.models import ExecuteBody, ProposeBody
from app.deps import CurrentPrincipal, State
from app.responses import JSON

router = APIRouter()


@router.post("/propose")
async def propose(body: ProposeBody, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await service.propose(state, principal, body))


@router.post("/execute")
async def execute(body: ExecuteBody, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await service.execute(state, principal, body))
