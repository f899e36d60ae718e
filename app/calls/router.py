"""HTTP for /propose, /dry-run and /execute: parse, call the service, return.

The three decision endpoints are plain Starlette routes (``add_route``): they take the
``Request`` and parse it themselves (``app.deps``), and FastAPI's per-route machinery
(dependency solving, its exit stacks) cost every read CPU for nothing they use."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.calls import history, service
from app.calls.models import DryRunBody, ExecuteBody, IdempotencyKey, ProposeBody
from app.deps import CurrentPrincipal, State, authenticate, read_body, state_of
from app.responses import JSON

router = APIRouter()


async def propose(request: Request) -> JSON:
    principal = await authenticate(request)
    body = await read_body(request, ProposeBody)
    return JSON(await service.propose(state_of(request), principal, body))


async def dry_run(request: Request) -> JSON:
    principal = await authenticate(request)
    body = await read_body(request, DryRunBody)
    return JSON(await service.dry_run(state_of(request), principal, body))


async def execute(request: Request) -> JSON:
    principal = await authenticate(request)
    body = await read_body(request, ExecuteBody)
    key = IdempotencyKey.parse(request.headers.get("idempotency-key"))
    outcome = await service.execute(state_of(request), principal, body, key)
    return JSON(outcome.body, headers=outcome.headers)


router.add_route("/propose", propose, methods=["POST"])
router.add_route("/dry-run", dry_run, methods=["POST"])
router.add_route("/execute", execute, methods=["POST"])


@router.get("/calls/{call_id}")
async def call_history(
    call_id: str, principal: CurrentPrincipal, state: State, wait: float | None = None
) -> JSON:
    """``wait=S``: answer once the call leaves a waiting state, or after S seconds."""
    return JSON(await history.history_after(state, principal, call_id, wait))
