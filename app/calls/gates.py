"""What a mutation's first call must show before it may run: an approval of this call that
is approved, unexpired, unused and bound to exactly this request, and, for a tool that
requires one, an unexpired dry-run of it."""

from __future__ import annotations

from datetime import UTC, datetime

from app.approvals import store as approvals
from app.approvals.models import ApprovalRow, Binding
from app.calls import store
from app.calls.models import Authorized, DryRunRow
from app.errors import (
    ApprovalConsumed,
    ApprovalExpired,
    ApprovalMismatch,
    ApprovalRejected,
    ApprovalRequired,
    DryRunRequired,
)
from app.state import AppState


async def valid_approval(
    state: AppState,
    authorized: Authorized,
    approval_id: str | None,
    call_id: str | None,
    dry_run_id: str | None,
) -> ApprovalRow:
    """The approval ``approval_id``, if it is approved, unexpired, unused and bound to this
    request (and to ``call_id``, when the request names its call)."""
    call, principal = authorized.call, authorized.principal
    if approval_id is None:
        raise ApprovalRequired("this call is high impact and needs an approval_id")
    async with state.db.connection() as conn:
        approval = await approvals.get(conn, approval_id)
        dry_run = await store.dry_run_for(
            conn, principal.tenant, principal.sub, call.fingerprint, dry_run_id
        )
    if approval is None or approval.tenant != principal.tenant:
        raise ApprovalRequired("no such approval")
    if call_id not in (None, approval.call_id):
        raise ApprovalRequired("the approval was given for another call")
    if approval.decision == "reject":
        raise ApprovalRejected("the approver rejected this call")
    if approval.expires_at <= datetime.now(UTC):
        raise ApprovalExpired("the approval has expired")
    mismatch = approval.binding.differences(binding(authorized, dry_run))
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


def binding(authorized: Authorized, dry_run: DryRunRow | None) -> Binding:
    call, principal = authorized.call, authorized.principal
    tool = call.tool
    snapshot_hash = dry_run.snapshot_hash if tool.dry_run and dry_run is not None else None
    return Binding(
        actor=principal.sub,
        tenant=principal.tenant,
        tool=tool.name,
        target=call.target.as_dict() if call.target else None,
        policy_version=authorized.catalog.policy_version,
        fingerprint=call.fingerprint,
        snapshot_hash=snapshot_hash,
    )


async def require_dry_run(state: AppState, authorized: Authorized, dry_run_id: str | None) -> None:
    call, principal = authorized.call, authorized.principal
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
