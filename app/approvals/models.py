"""Approval request bodies and stored rows."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field
from typing_extensions import TypedDict

from app.bodies import Body, Id, Text
from app.calls.answers import Timestamp
from app.evidence import Binding, EndorsementItem, Taint, Target


class ApproveBody(Body):
    call_id: Id
    snapshot_hash: Text | None = Field(max_length=200)
    decision: Literal["approve", "reject"]
    comment: Text | None = Field(default=None, max_length=2000)
    remember: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=50
    )
    """``x-endorsed`` arguments of the call whose values the approver vouches for from now
    on: each becomes a known value of the tenant for the argument's kind (approvals only)."""


# --- answers, as the OpenAPI document describes them (``app.calls.answers``) ----------------


class ApprovalAnswer(TypedDict):
    """``POST /approve``: the decision, stored with what it binds."""

    approval_id: str
    call_id: str
    decision: Literal["approve", "reject"]
    expires_at: Timestamp | None
    binding: Binding
    approvals: NotRequired[str | None]
    """For an approval: how many approvers agree on what it binds, of how many the tool
    needs (``approval.quorum``), as ``k/N``; the call runs once ``k`` reaches ``N``."""


class InboxItem(TypedDict):
    """A request the caller may decide. ``arguments`` has sensitive values masked; a pending
    request shows them in ``sensitive_arguments``, to the approvers who decide it."""

    call_id: str
    tool: str
    actor: str
    target: Target | None
    arguments: dict[str, Any]
    impact: str | None
    snapshot: Any
    snapshot_hash: str | None
    requested_at: Timestamp
    expires_at: Timestamp | None
    status: Literal["pending", "approved", "rejected", "expired"]
    taint: list[Taint]
    endorsement: NotRequired[list[EndorsementItem] | None]
    sensitive_arguments: NotRequired[dict[str, Any] | None]
    summary: NotRequired[dict[str, Any]]
    """The values of the arguments the tool's ``approval.summary`` names, as sent (absent
    ones left out): what tells this request from others of the same tool."""
    approvals: str
    """How many approvers approved its preview, of how many the tool needs
    (``approval.quorum``), as ``k/N``."""


class Inbox(TypedDict):
    """``GET /approvals``: newest first; ``next_cursor`` is null on the last page."""

    items: list[InboxItem]
    next_cursor: str | None
