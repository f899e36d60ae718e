"""HTTP for /approve and the approver's inbox, GET /approvals."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from app.approvals import service
from app.approvals.models import ApproveBody
from app.deps import CurrentPrincipal, State
from app.responses import JSON
from app.routing import DecisionRoute

decisions = APIRouter(route_class=DecisionRoute)
router = APIRouter()


@decisions.post("/approve")
async def approve(principal: CurrentPrincipal, state: State, body: ApproveBody) -> JSON:
    """A ``DecisionRoute``, like the other decision endpoints (``app.calls.router``)."""
    return JSON(await service.approve(state, principal, body))


@router.get("/approvals")
async def approvals(
    principal: CurrentPrincipal,
    state: State,
    status: Literal["pending", "approved", "rejected", "expired"] = "pending",
    cursor: str | None = None,
) -> JSON:
    return JSON(await service.inbox(state, principal, status, cursor))
