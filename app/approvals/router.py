"""HTTP for /approve and the approver's inbox, GET /approvals."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request

from app.approvals import service
from app.approvals.models import ApproveBody
from app.deps import CurrentPrincipal, State, authenticate, read_body, state_of
from app.responses import JSON

router = APIRouter()


async def approve(request: Request) -> JSON:
    """A plain Starlette route, like the other decision endpoints (``app.calls.router``)."""
    principal = await authenticate(request)
    body = await read_body(request, ApproveBody)
    return JSON(await service.approve(state_of(request), principal, body))


router.add_route("/approve", approve, methods=["POST"])


@router.get("/approvals")
async def approvals(
    principal: CurrentPrincipal,
    state: State,
    status: Literal["pending", "approved", "rejected", "expired"] = "pending",
    cursor: str | None = None,
) -> JSON:
    return JSON(await service.inbox(state, principal, status, cursor))
