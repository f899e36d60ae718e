"""What the call endpoints answer: the contract, typed once.

Each answer is a ``TypedDict``, and both sides of the contract are made from it: the OpenAPI
document's schemas (pydantic reads them as it reads models), and mypy's check of every
answer a use case builds. Answers stay plain dicts at run time, rendered by
``app.responses.JSON``, so nothing is validated twice on the request path; the tests check
real answers against the document's schemas. Members may be added; none is removed.
``NotRequired`` marks a member some answers leave out.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import WithJsonSchema
from typing_extensions import TypedDict

from app.calls.states import CallState, ExecutionState, Next
from app.catalog.models import Impact
from app.evidence import AuthorizedBy, Binding, EndorsementItem, Taint, Target

Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
"""A moment in an answer: ISO 8601 text (``datetime.isoformat``), described as ``date-time``."""


class Proposal(TypedDict):
    """``POST /propose``: the call is allowed, and ``next`` says what it still needs."""

    call_id: str
    tool: str
    decision: Literal["allow"]
    mutation: bool
    impact: Impact
    next: Next
    arguments: dict[str, Any]
    """Normalized: defaults filled in, identity arguments from the token."""
    fingerprint: str
    target: Target | None
    policy_version: str
    proposed_by: Literal["model"]
    authorized_by: AuthorizedBy
    taint: list[Taint]
    """Arguments carrying values from untrusted results of the run (empty outside a run)."""
    endorsement: NotRequired[list[EndorsementItem] | None]
    """For a tool with ``x-endorsed`` arguments."""


class Preview(TypedDict):
    """``POST /dry-run``: the provider's preview, stored with its hash."""

    dry_run_id: str
    call_id: str
    snapshot: Any
    snapshot_hash: str
    """What an approver echoes in ``/approve``."""
    expires_at: Timestamp
    next: Next


class Execution(TypedDict):
    """``POST /execute``: what the provider answered, trimmed. ``status`` is ``succeeded``
    (provider 2xx) or ``failed`` (4xx, stored and replayed as well); both answer 200."""

    call_id: str
    operation_id: str | None
    """``None`` for a read, which has no execution record."""
    status: Literal["succeeded", "failed"]
    provider_status: int
    result: Any
    trust: Literal["untrusted"]
    """The result is data from outside, never instructions."""
    replayed: bool
    endorsement: NotRequired[list[EndorsementItem] | None]
    """For a tool with ``x-endorsed`` arguments: what endorsed them."""


class CallProposal(TypedDict):
    """``arguments`` has sensitive values masked (``null``: the call was refused before its
    arguments were valid, and none were stored); ``sensitive_arguments`` shows them, only to
    a caller who may decide the call now."""

    arguments: dict[str, Any] | None
    fingerprint: str | None
    target: Target | None
    mutation: bool | None
    impact: Impact | None
    next: Next | None
    decision: Literal["allow", "deny"]
    code: str | None
    reason: str | None
    policy_version: str
    proposed_by: Literal["model"]
    authorized_by: AuthorizedBy | None
    taint: list[Taint]
    endorsement: NotRequired[list[EndorsementItem] | None]
    sensitive_arguments: NotRequired[dict[str, Any] | None]


class CallDecision(TypedDict):
    """One audited step of the call, oldest first."""

    seq: int
    at: Timestamp
    event: str
    decision: str | None
    code: str | None
    reason: str | None
    policy_version: str | None
    approval_id: str | None
    authorized_by: AuthorizedBy | None
    outcome: dict[str, Any] | None
    total_ms: float | None
    provider_ms: float | None


class CallDryRun(TypedDict):
    dry_run_id: str
    fingerprint: str
    snapshot: Any
    snapshot_hash: str
    policy_version: str
    created_at: Timestamp
    expires_at: Timestamp


class CallApproval(TypedDict):
    approval_id: str
    decision: Literal["approve", "reject"]
    approver: str
    comment: str | None
    binding: Binding
    created_at: Timestamp
    expires_at: Timestamp | None
    consumed_by: str | None
    consumed_at: Timestamp | None


class CallExecution(TypedDict):
    operation_id: str
    state: ExecutionState
    provider_status: int | None
    approval_id: str | None
    created_at: Timestamp
    updated_at: Timestamp


class CallTimings(TypedDict):
    created_at: Timestamp
    updated_at: Timestamp
    decision_ms: float | None
    provider_ms: float | None


class CallHistory(TypedDict):
    """``GET /calls/{call_id}``: the call's whole life. ``may_decide``: the caller may
    approve or reject it now."""

    call_id: str
    tool: str
    actor: str
    tenant: str
    run_id: str | None
    tool_call_id: str | None
    state: CallState
    may_decide: bool
    proposal: CallProposal
    decisions: list[CallDecision]
    """The newest audit rows of the call (at most 200), oldest first."""
    decisions_total: int
    """How many audit rows the call has in all."""
    dry_runs: list[CallDryRun]
    """The call's newest previews (at most 10), oldest first; only the latest two carry
    their ``snapshot``, older ones only their hash."""
    dry_runs_total: int
    """How many previews the call keeps in all (its newest 10, and those an approver
    decided on)."""
    approvals: NotRequired[str | None]
    """For a tool with approvers: how many agree on the call's latest approval, of how many
    it needs (``approval.quorum``), as ``k/N``."""
    approval: CallApproval | None
    executions: list[CallExecution]
    timings: CallTimings
