"""HTTP for /approve and the approver's inbox, GET /approvals."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from app import errors
from app.approvals import service
from app.approvals.models import ApprovalAnswer, ApproveBody, Inbox
from app.deps import AUTHENTICATED, CurrentPrincipal, State
from app.responses import JSON, problems
from app.routing import DecisionRoute, operation_id

decisions = APIRouter(route_class=DecisionRoute, generate_unique_id_function=operation_id)
router = APIRouter()


@decisions.post(
    "/approve",
    response_model=ApprovalAnswer,
    responses=problems(
        *AUTHENTICATED,
        errors.ContentTooLarge,
        errors.NotFound,
        errors.ToolForbidden,
        errors.InvalidArguments,
        errors.ProviderUnavailable,
        errors.ApproverForbidden,
        errors.ApprovalMismatch,
        errors.ApprovalConsumed,
        errors.ApprovalRejected,
        errors.ApprovalExpired,
        errors.DryRunRequired,
    ),
)
async def approve(principal: CurrentPrincipal, state: State, body: ApproveBody) -> JSON:
    """A ``DecisionRoute``, like the other decision endpoints (``app.calls.router``)."""
    return JSON(await service.approve(state, principal, body))


@router.get("/approvals", response_model=Inbox, responses=problems(*AUTHENTICATED))
async def inbox(
    principal: CurrentPrincipal,
    state: State,
    status: Literal["pending", "approved", "rejected", "expired"] = "pending",
    cursor: str | None = None,
) -> JSON:
    return JSON(await service.inbox(state.db, state.catalog, principal, status, cursor))
