"""HTTP for runs: create, read, finish."""

from __future__ import annotations

from fastapi import APIRouter

from app.deps import AUTHENTICATED, CurrentPrincipal, PathId, State
from app.errors import ContentTooLarge, NotFound
from app.responses import JSON, problems
from app.runs import service
from app.runs.models import FinishBody, Run, RunBody, RunCreated, ScopeBody

router = APIRouter()


@router.post(
    "/runs", response_model=RunCreated, responses=problems(*AUTHENTICATED, ContentTooLarge)
)
async def create_run(
    principal: CurrentPrincipal, state: State, body: RunBody | None = None
) -> JSON:
    """The body is optional: a run with no task and the server's limits."""
    return JSON(await service.create(state.db, principal, body or RunBody()))


@router.patch(
    "/runs/{run_id}",
    response_model=Run,
    responses=problems(*AUTHENTICATED, ContentTooLarge, NotFound),
)
async def narrow_run(
    run_id: PathId, body: ScopeBody, principal: CurrentPrincipal, state: State
) -> JSON:
    """Narrow the run's scope (never widen it)."""
    return JSON(await service.narrow(state.db, state.catalog, principal, run_id, body))


@router.get("/runs/{run_id}", response_model=Run, responses=problems(*AUTHENTICATED, NotFound))
async def read_run(run_id: PathId, principal: CurrentPrincipal, state: State) -> JSON:
    return JSON(await service.read(state.db, state.catalog, principal, run_id))


@router.post(
    "/runs/{run_id}/finish",
    response_model=Run,
    responses=problems(*AUTHENTICATED, ContentTooLarge, NotFound),
)
async def finish_run(
    run_id: PathId, body: FinishBody, principal: CurrentPrincipal, state: State
) -> JSON:
    return JSON(await service.finish(state.db, state.catalog, principal, run_id, body))
