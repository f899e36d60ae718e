"""What a mutation's first call must show before it may run: an approval of this call that
is approved, unexpired, unused and bound to exactly this request, and, for a tool that
requires one, an unexpired dry-run of it."""

from __future__ import annotations

from datetime import UTC, datetime

from app.approvals import store as approvals
from app.approvals.models import ApprovalRow, Binding
from app.calls import store
from app.calls.decisions import Attempt
from app.calls.models import DryRunRow, ExecuteBody
from app.calls.policy import PreparedCall
from app.errors import (
    ApprovalConsumed,
    ApprovalExpired,
    ApprovalMismatch,
    ApprovalRejected,
    ApprovalRequired,
    DryRunRequired,
)
from app.state import AppState


async def valid_approval(state: AppState, attempt: Attempt, body: ExecuteBody) -> ApprovalRow:
    """The named approval, if it is approved, unexpired, unused and bound to this request."""
    call, principal = attempt.call, attempt.principal
    assert call is not None
    if body.approval_id is None:
        raise ApprovalRequired("this call is high impact and needs an approval_id")
    async with state.db.connection() as conn:
        approval = await approvals.get(conn, body.approval_id)
        dry_run = await store.dry_run_for(
            conn, principal.tenant, principal.sub, call.fingerprint, body.dry_run_id
        )
    if approval is None or approval.tenant != principal.tenant:
        raise ApprovalRequired("no such approval")
    if body.call_id not in (None, approval.call_id):
        raise ApprovalRequired("the approval was given for another call")
    if approval.decision == "reject":
        raise ApprovalRejected("the approver rejected this call")
    if approval.expires_at <= datetime.now(UTC):
        raise ApprovalExpired("the approval has expired")
    mismatch = approval.binding.differences(binding(attempt, call, dry_run))
    if mismatch:
        raise ApprovalMismatch(
            "the approval was given for something else: " + ", ".join(mismatch),
            mismatch=mismatch,
        )
    if call.tool.require_dry_run:
        _check_fresh(dry_run)
    if approval.consumed_by is not None:
        raise ApprovalConsumed("the approval was used by another execution")
    return approval


def binding(attempt: Attempt, call: PreparedCall, dry_run: DryRunRow | None) -> Binding:
    tool = call.tool
    snapshot_hash = dry_run.snapshot_hash if tool.dry_run and dry_run is not None else None
    return Binding(
        actor=attempt.principal.sub,
        tenant=attempt.principal.tenant,
        tool=tool.name,
        target=call.target.as_dict() if call.target else None,
        policy_version=attempt.catalog.policy_version,
        fingerprint=call.fingerprint,
        snapshot_hash=snapshot_hash,
    )


async def require_dry_run(state: AppState, attempt: Attempt, dry_run_id: str | None) -> None:
    call, principal = attempt.call, attempt.principal
    assert call is not None
    async with state.db.connection() as conn:
        dry_run = await store.dry_run_for(
            conn, principal.tenant, principal.sub, call.fingerprint, dry_run_id
        )
    _check_fresh(dry_run)


def _check_fresh(dry_run: DryRunRow | None) -> None:
    """A ``require_dry_run`` tool runs only on an unexpired dry-run of the same arguments,
    approved or not: an approval does not extend the preview it was given on."""
    if dry_run is None or dry_run.expires_at <= datetime.now(UTC):
        raise DryRunRequired("this call needs an unexpired dry-run of the same arguments")
