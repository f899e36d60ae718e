"""HTTP for runs: create, read, finish."""

from __future__ import annotations

from fastapi import APIRouter

from app.deps import CurrentPrincipal, State
from app.responses import JSON
from app.runs import service
from app.runs.models import FinishBody, RunBody

router = APIRouter()


@router.post("/runs")
async def create(principal: CurrentPrincipal, state: State, body: RunBody | None = None) -> JSON:
    """The body is optional: a run with no task and the server's limits."""
    return JSON(await service.create(state, principal, body or RunBody()))


@router.get("/runs/{run_id}")
async def read(run_id: str, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await service.read(state, principal, run_id))


@router.post("/runs/{run_id}/finish")
async def finish(run_id: str, body: FinishBody, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await service.finish(state, principal, run_id, body))
