"""What a mutation's first call must show before it may run: an approval of this call that
is approved, unexpired, unused and bound to exactly this request (and, for a tool that
rechecks, whose preview still stands), and, for a tool that requires one, an unexpired
dry-run of it."""

from __future__ import annotations

from datetime import UTC, datetime

from app.calls import store
from app.calls.models import Authorized, CallRow, DryRunRow
from app.calls.policy import PreparedCall
from app.calls.results import classify
from app.canonical import digest
from app.consent import rules
from app.consent import store as approvals
from app.consent.models import ApprovalRow
from app.db import Database
from app.errors import (
    ApprovalConsumed,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalStale,
    DryRunRequired,
    NotFound,
    ProviderTimeout,
    ProviderUnavailable,
)
from app.evidence import Binding
from app.outbound import NotSent, Response, TooLarge, Uncertain
from app.providers import ProviderClient

TOO_LARGE = "the provider's response is too large"


async def preview(providers: ProviderClient, authorized: Authorized, call_id: str) -> Response:
    """The provider's preview of the authorized call (its ``dry_run`` endpoint); nothing
    certain to show is a 502 or 504, never an empty preview."""
    call, tool = authorized.call, authorized.tool
    assert tool.dry_run is not None
    try:
        response = await providers.call(
            tool.provider, tool.dry_run, call.arguments, authorized.principal, call_id
        )
    except NotSent as exc:
        raise ProviderUnavailable("the provider could not be reached", call_id=call_id) from exc
    except TooLarge as exc:
        raise ProviderUnavailable(TOO_LARGE, call_id=call_id) from exc
    except Uncertain as exc:
        raise ProviderTimeout(
            "the provider did not answer the preview in time", call_id=call_id
        ) from exc
    if classify(response.status) != "succeeded":
        raise ProviderUnavailable(
            "the provider gave no preview", call_id=call_id, provider_status=response.status
        )
    if response.body is None:
        # Empty, not JSON, or nested too deeply: a null snapshot shows the approver nothing,
        # and hashes the same on every recheck, so no change could make its approval stale.
        raise ProviderUnavailable(
            "the provider's preview is not a JSON answer",
            call_id=call_id,
            provider_status=response.status,
        )
    return response


async def recheck(
    db: Database, providers: ProviderClient, authorized: Authorized, approval: ApprovalRow
) -> Response:
    """Preview the approved call again (``approval.recheck``): the approval holds only if
    the world still looks as the approver saw it. A changed preview is ``ApprovalStale``,
    with both hashes; the current preview otherwise. An approval that consumption would
    refuse anyway (its call rejected, or run on another approval) is refused as such: before
    asking the provider, and again when the preview changed, since the change may be that
    very execution's effect (it consumed the approval before it sent)."""
    await _refuse_used(db, approval)
    response = await preview(providers, authorized, approval.call_id)
    current = digest(response.body)
    if current != approval.snapshot_hash:
        await _refuse_used(db, approval)
        raise ApprovalStale(
            "the preview changed since the approval: preview and approve the call again",
            call_id=approval.call_id,
            approved_snapshot_hash=approval.snapshot_hash,
            current_snapshot_hash=current,
        )
    return response


async def valid_approval(
    db: Database,
    authorized: Authorized,
    approval_id: str | None,
    call_id: str | None,
    dry_run_id: str | None,
) -> ApprovalRow:
    """The approval ``approval_id`` (or the call's, by ``call_id``), if it is approved,
    unexpired, unused and bound to this request (and to ``call_id``, when the request names
    its call). The preview it is held against is always its call's latest dry-run: a newer
    preview reopened the call, so naming an older one (``dry_run_id``) is a mismatch."""
    call, principal = authorized.call, authorized.principal
    if approval_id is None and call_id is None:
        raise ApprovalRequired("this call is high impact and needs an approval_id")
    async with db.connection() as conn:
        if approval_id is not None:
            approval = await approvals.get(conn, approval_id)
        else:
            assert call_id is not None
            approval = rules.standing_approval(await approvals.standing(conn, call_id))
            if approval is None:  # none standing: its latest, expired, if any, says so
                decided = await approvals.of_call(conn, call_id)
                approval = decided[-1] if decided else None
        dry_run = await store.latest_dry_run(conn, approval.call_id) if approval else None
        needed = rules.quorum(call.tool)
        decided = await approvals.of_call(conn, approval.call_id) if approval and needed > 1 else []
    presented = rules.Presented(
        tenant=principal.tenant,
        named=approval_id is not None,
        call_id=call_id,
        current=binding(authorized, dry_run),
        older_preview=dry_run_id is not None and (dry_run is None or dry_run.id != dry_run_id),
    )
    now = datetime.now(UTC)
    approval = rules.usable(approval, presented, now)
    if call.tool.require_dry_run:
        _check_fresh(dry_run)
    approval = rules.unused(approval)
    return rules.quorate(approval, decided, needed, now) if needed > 1 else approval


async def _refuse_used(db: Database, approval: ApprovalRow) -> None:
    async with db.connection() as conn:
        standing = await approvals.standing(conn, approval.call_id)
    if any(a.decision == "reject" or a.consumed_by is not None for a in standing):
        raise ApprovalConsumed("the call was already rejected or executed")


def check_same_call(existing: CallRow | None, call: PreparedCall) -> None:
    """A request that names its call runs that call: other arguments, or another target, make
    it another call, which the call's approval and preview do not cover."""
    if existing is None or existing.fingerprint == call.fingerprint:
        return
    mismatch = [
        name
        for name, differs in (
            ("tool", existing.tool != call.tool.name),
            ("target", existing.target != (call.target.as_dict() if call.target else None)),
            ("arguments", existing.arguments != call.arguments),
        )
        if differs
    ] or ["arguments"]
    raise ApprovalMismatch(
        "call_id names a call with other " + ", ".join(mismatch),
        call_id=existing.id,
        mismatch=mismatch,
    )


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


async def require_dry_run(db: Database, authorized: Authorized, dry_run_id: str | None) -> None:
    call, principal = authorized.call, authorized.principal
    async with db.connection() as conn:
        dry_run = await store.dry_run_for(
            conn, principal.tenant, principal.sub, call.fingerprint, dry_run_id
        )
    _check_fresh(dry_run)


async def named_dry_run(db: Database, authorized: Authorized, dry_run_id: str) -> None:
    """A dry-run the request names where no gate needs one must still be this actor's
    dry-run of these arguments: an id that is given is honoured or refused, never ignored."""
    call, principal = authorized.call, authorized.principal
    async with db.connection() as conn:
        dry_run = await store.dry_run_for(
            conn, principal.tenant, principal.sub, call.fingerprint, dry_run_id
        )
    if dry_run is None:
        raise NotFound("no such dry-run of these arguments")


def _check_fresh(dry_run: DryRunRow | None) -> None:
    """A ``require_dry_run`` tool runs only on an unexpired dry-run of the same arguments,
    approved or not: an approval does not extend the preview it was given on."""
    if dry_run is None or dry_run.expires_at <= datetime.now(UTC):
        raise DryRunRequired("this call needs an unexpired dry-run of the same arguments")
