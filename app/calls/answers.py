"""What the call endpoints answer, as the OpenAPI document describes it.

The endpoints build their answers as plain JSON (``app.responses.JSON``), so nothing is
validated twice on the request path; these models are the contract, and the tests check
real answers against the schemas made from them. Members may be added; none is removed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from app.calls.states import CallState, ExecutionState, Next
from app.catalog.models import Impact


class Target(BaseModel):
    """The resource a call acts on, as the tool's catalog entry names it."""

    type: str
    id: str


class AuthorizedBy(BaseModel):
    """Who let the call go this far: the policy (for the actor), or an approval."""

    kind: Literal["policy", "approval"]
    sub: str
    tenant: str
    policy_version: str
    approval_id: str | None = None


class Taint(BaseModel):
    """An argument holding a value an untrusted result of the same run returned, and the
    call that returned it."""

    argument: str
    source_call_id: str


class EndorsementItem(BaseModel):
    """What endorses an ``x-endorsed`` argument: the run's ``task``, a ``trusted_result``
    of the run, or a ``known`` value of the tenant; ``null`` with ``endorsed: false`` when
    nothing does (``reason`` says why), or with ``endorsed: true`` when its text holds no
    link to judge. Never a value."""

    argument: str
    source: Literal["task", "trusted_result", "known"] | None
    endorsed: bool
    reason: str | None = None


class Proposal(BaseModel):
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
    endorsement: list[EndorsementItem] | None = None
    """For a tool with ``x-endorsed`` arguments."""
    """Arguments carrying values from untrusted results of the run (empty outside a run)."""


class Preview(BaseModel):
    """``POST /dry-run``: the provider's preview, stored with its hash."""

    dry_run_id: str
    call_id: str
    snapshot: Any
    snapshot_hash: str
    """What an approver echoes in ``/approve``."""
    expires_at: datetime
    next: Next


class Execution(BaseModel):
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
    endorsement: list[EndorsementItem] | None = None
    """For a tool with ``x-endorsed`` arguments: what endorsed them."""


class CallProposal(BaseModel):
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
    endorsement: list[EndorsementItem] | None = None
    sensitive_arguments: dict[str, Any] | None = None


class CallDecision(BaseModel):
    """One audited step of the call, oldest first."""

    seq: int
    at: datetime
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


class CallDryRun(BaseModel):
    dry_run_id: str
    fingerprint: str
    snapshot: Any
    snapshot_hash: str
    policy_version: str
    created_at: datetime
    expires_at: datetime


class Binding(BaseModel):
    """What an approval covers; change any part and it no longer applies."""

    actor: str
    tenant: str
    tool: str
    target: Target | None
    policy_version: str
    fingerprint: str
    snapshot_hash: str | None


class CallApproval(BaseModel):
    approval_id: str
    decision: Literal["approve", "reject"]
    approver: str
    comment: str | None
    binding: Binding
    created_at: datetime
    expires_at: datetime | None
    consumed_by: str | None
    consumed_at: datetime | None


class CallExecution(BaseModel):
    operation_id: str
    state: ExecutionState
    provider_status: int | None
    approval_id: str | None
    created_at: datetime
    updated_at: datetime


class CallTimings(BaseModel):
    created_at: datetime
    updated_at: datetime
    decision_ms: float | None
    provider_ms: float | None


class CallHistory(BaseModel):
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
    approvals: str | None = None
    """For a tool with approvers: how many agree on the call's latest approval, of how many
    it needs (``approval.quorum``), as ``k/N``."""
    approval: CallApproval | None
    executions: list[CallExecution]
    timings: CallTimings
