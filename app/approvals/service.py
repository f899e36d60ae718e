"""Deciding on a call: the approver's authority, the preview they saw, and the binding.

An approval binds actor, tenant, tool, target, policy version, fingerprint and the snapshot
hash of the dry-run the human saw; execution compares that binding with its own request.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from app import cursors
from app.approvals.models import ApprovalAnswer, ApproveBody, Inbox, InboxItem
from app.audit.store import AuditEvent, append
from app.auth.principal import Principal
from app.calls import policy
from app.calls import store as calls
from app.calls.authorization import owners_of
from app.calls.models import CallRow, DryRunRow
from app.calls.results import mask_arguments, sensitive_values
from app.calls.services import Services
from app.calls.states import STARTED, CallState
from app.catalog.models import Catalog, Tool
from app.consent import rules, store
from app.consent.models import ApprovalRow
from app.db import Connection, Database
from app.errors import (
    ApprovalExpired,
    ApprovalMismatch,
    ApproverForbidden,
    DryRunRequired,
    InvalidRequest,
    NotFound,
    ToolForbidden,
)
from app.evidence import Binding
from app.ids import new_id
from app.known import service as known
from app.providers import ProviderClient
from app.runs import endorsement
from app.webhooks import store as webhooks


async def approve(state: Services, principal: Principal, body: ApproveBody) -> ApprovalAnswer:
    started = time.perf_counter()
    catalog = state.catalog
    async with state.db.connection() as conn:
        call = await calls.get(conn, body.call_id)
        latest = await calls.latest_dry_run(conn, body.call_id) if call else None
    if call is None or call.tenant != principal.tenant:  # another tenant's looks missing
        raise NotFound("no such call")
    tool = catalog.tools.get(call.tool)
    if tool is None or tool.approval is None or call.impact != "high" or call.arguments is None:
        raise InvalidRequest("this call does not await an approval", call_id=call.id)
    if not rules.may_approve(principal, call.actor, call.tenant, tool.approval.approvers):
        raise ApproverForbidden("you may not decide this call", call_id=call.id)
    remember = _remember(tool, call, body, state.settings.known_values_keys)
    binding = _binding(catalog.policy_version, tool, call, latest, body.snapshot_hash)
    await _check_ownership(state.providers, tool, call)
    now = datetime.now(UTC)
    approval = ApprovalRow(
        id=new_id("apr"),
        call_id=call.id,
        decision=body.decision,
        approver=principal.sub,
        comment=body.comment,
        actor=binding["actor"],
        tenant=binding["tenant"],
        tool=binding["tool"],
        target_type=call.target_type,
        target_id=call.target_id,
        policy_version=binding["policy_version"],
        fingerprint=binding["fingerprint"],
        snapshot_hash=binding["snapshot_hash"],
        expires_at=now + timedelta(seconds=tool.approval.ttl_s),
        remember=remember or None,
    )
    needed = rules.quorum(tool)
    async with state.db.transaction() as conn:
        call_state = await calls.lock(conn, call.id)
        standing = await store.standing(conn, call.id)
        repeated = rules.repeated(approval, call_state in STARTED, standing, needed)
        quorum = rules.concurring(approval, standing if repeated else [*standing, approval], now)
        given = len({a.approver for a in quorum})
        if repeated is None:
            moves_to: CallState | None = (
                "rejected"
                if approval.decision == "reject"
                else "approved"
                if given >= needed
                else None  # else: a quorum awaits others
            )
            await _record(conn, approval, call, tool, catalog.policy_version, started, moves_to)
            if moves_to == "approved":
                await _vouch(conn, state.settings.known_values_keys, catalog, tool, call, quorum)
            elif moves_to == "rejected":
                await known.withdraw(conn, call.tenant, call.id, principal.sub)
            decided = "approved" if approval.decision == "approve" else "rejected"
            data = webhooks.call_data(
                call.id, call.tool, call.tenant, call.actor, call.run_id, decided
            )
            data.update(approval_id=approval.id, approver=approval.approver)
            if approval.decision == "approve":
                data.update(approvals=f"{given}/{needed}")
            await webhooks.announce(conn, catalog, webhooks.APPROVAL_DECIDED, data)
    answer = _answer(repeated or approval)
    if approval.decision == "approve":
        answer["approvals"] = f"{given}/{needed}"
    return answer


async def _record(
    conn: Connection,
    approval: ApprovalRow,
    call: CallRow,
    tool: Tool,
    policy_version: str,
    started: float,
    moves_to: CallState | None,
) -> None:
    """Store the decision, move the call (unless it still awaits approvals of a quorum),
    and write its audit row."""
    assert call.arguments is not None
    await store.insert(conn, approval)
    if moves_to is not None:
        await calls.set_state(conn, call.id, moves_to)
    await append(
        conn,
        AuditEvent(
            event="approved" if approval.decision == "approve" else "rejected",
            tenant=call.tenant,
            actor=call.actor,
            call_id=call.id,
            run_id=call.run_id,
            tool=call.tool,
            target=call.target,
            fingerprint=approval.fingerprint,
            arguments=mask_arguments(call.arguments, tool.sensitive_args),
            decision=approval.decision,
            reason=approval.comment,
            policy_version=policy_version,
            approval_id=approval.id,
            proposed_by=call.proposed_by,
            authorized_by={
                "kind": "approval",
                "sub": approval.approver,
                "tenant": approval.tenant,
                "approval_id": approval.id,
                "policy_version": policy_version,
            },
            total_ms=(time.perf_counter() - started) * 1000,
            outcome={"remember": approval.remember} if approval.remember else None,
        ),
    )


def _remember(tool: Tool, call: CallRow, body: ApproveBody, keys: tuple[bytes, ...]) -> list[str]:
    """The ``x-endorsed`` arguments the approver asks to remember, each once. Only an
    approval vouches, only for the tool's ``x-endorsed`` arguments, and never for a
    sensitive one: a password is not a value to endorse other calls by."""
    if not body.remember:
        return []
    if body.decision != "approve":
        raise InvalidRequest("remember vouches for values: only an approval does", call_id=call.id)
    endorsed = {arg.argument for arg in tool.endorsed_args}
    unknown = sorted(set(body.remember) - endorsed)
    if unknown:
        raise InvalidRequest(
            "remember names arguments that are not x-endorsed: " + ", ".join(unknown),
            call_id=call.id,
        )
    sensitive = sorted(set(body.remember) & set(tool.sensitive_args))
    if sensitive:
        raise InvalidRequest(
            "remember names sensitive arguments, which are never remembered: "
            + ", ".join(sensitive),
            call_id=call.id,
        )
    known.keyed(keys)
    return list(dict.fromkeys(body.remember))


async def _vouch(
    conn: Connection,
    keys: tuple[bytes, ...],
    catalog: Catalog,
    tool: Tool,
    call: CallRow,
    quorum: list[ApprovalRow],
) -> None:
    """The approval completing the quorum: remember what every approver of it asked to
    remember, for as long as the approvals could run the call (and for good once it has)."""
    vouched = rules.vouched(quorum)
    if not vouched.arguments:
        return
    by_name = {arg.argument: arg for arg in tool.endorsed_args}
    values = endorsement.candidates([by_name[a] for a in vouched.arguments], call.arguments or {})
    vouch = known.Vouch(
        tenant=call.tenant,
        by=quorum[-1].approver,  # the approval completing the quorum, read last
        user=vouched.user,
        call_id=call.id,
        until=vouched.until,
        approvers=tuple(a.approver for a in quorum),
    )
    await known.remember(conn, keys, catalog, vouch, values)


def _answer(approval: ApprovalRow) -> ApprovalAnswer:
    return {
        "approval_id": approval.id,
        "call_id": approval.call_id,
        "decision": approval.decision,
        "expires_at": approval.expires_at.isoformat(),
        "binding": approval.binding,
    }


def _binding(
    policy_version: str, tool: Tool, call: CallRow, latest: DryRunRow | None, seen: str | None
) -> Binding:
    """What this approval will cover: the call as the human saw it in its latest dry-run."""
    assert call.fingerprint is not None
    fingerprint, snapshot_hash = call.fingerprint, None
    if tool.dry_run is not None:
        if latest is None or latest.expires_at <= datetime.now(UTC):
            raise DryRunRequired("preview the call (dry-run) before deciding", call_id=call.id)
        fingerprint, snapshot_hash = latest.fingerprint, latest.snapshot_hash
        base_version = latest.policy_version
    else:
        if call.state == "awaiting_approval" and not call.pending(datetime.now(UTC)):
            raise ApprovalExpired(
                "the request for a decision on this call has expired; the call must be "
                "proposed again",
                call_id=call.id,
            )
        base_version = call.policy_version
    mismatch = [
        name
        for name, differs in (
            ("snapshot_hash", seen != snapshot_hash),
            ("policy_version", base_version != policy_version),
        )
        if differs
    ]
    if mismatch:
        raise ApprovalMismatch(
            "what you saw is not the call's latest preview under the current policy",
            mismatch=mismatch,
            call_id=call.id,
        )
    return Binding(
        actor=call.actor,
        tenant=call.tenant,
        tool=call.tool,
        target=call.target,
        policy_version=policy_version,
        fingerprint=fingerprint,
        snapshot_hash=snapshot_hash,
    )


async def _check_ownership(providers: ProviderClient, tool: Tool, call: CallRow) -> None:
    """The target must still belong to the actor's tenant (and user) right now."""
    prepared = policy.prepare(tool, call.arguments)
    try:
        policy.check_owners(tool, call.tenant, call.actor, await owners_of(providers, prepared))
    except ToolForbidden as denial:
        denial.extra["call_id"] = call.id
        raise


PAGE_SIZE = 50


async def inbox(
    db: Database, catalog: Catalog, principal: Principal, status: str, cursor: str | None
) -> Inbox:
    """Requests this principal may decide, in their tenant, newest first. A pending request
    also carries its sensitive values unmasked (``sensitive_arguments``): the approver must
    see what they approve; ``arguments`` stays masked, as in every listing.

    The query keeps only what the principal may decide (``rules.decidable``), so a page holds
    up to ``PAGE_SIZE`` of their requests, and its cursor is the last request it shows, present
    when the page is full: it never names a call the caller may not see."""
    before = None
    if cursor is not None:
        stamp, call_id = cursors.decode(cursor, 2)
        before = (cursors.instant(stamp), call_id)
    decidable = rules.decidable(principal, catalog.tools)
    if not decidable.others and not decidable.own:
        return {"items": [], "next_cursor": None}
    async with db.connection() as conn:
        rows = await store.inbox(conn, principal.tenant, decidable, status, before, PAGE_SIZE)
    items = []
    for row in rows:
        tool = catalog.tools[row.tool]
        item: InboxItem = {
            "call_id": row.call_id,
            "tool": row.tool,
            "actor": row.actor,
            "target": row.target,
            "arguments": mask_arguments(row.arguments, tool.sensitive_args),
            "impact": row.impact,
            "snapshot": row.snapshot,
            "snapshot_hash": row.snapshot_hash,
            "requested_at": row.requested_at.isoformat(),
            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
            "status": row.status,
            "taint": row.taint or [],
            "summary": _summary(tool, row.arguments),
            "approvals": f"{row.given}/{rules.quorum(tool)}",
        }
        if row.endorsement:
            item["endorsement"] = row.endorsement
        if row.status == "pending" and tool.sensitive_args:
            item["sensitive_arguments"] = sensitive_values(row.arguments, tool.sensitive_args)
        items.append(item)
    last = rows[-1] if len(rows) == PAGE_SIZE else None
    return {
        "items": items,
        "next_cursor": (
            cursors.encode(last.requested_at.isoformat(), last.call_id) if last else None
        ),
    }


def _summary(tool: Tool, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """The values ``approval.summary`` names, as sent (never sensitive: the catalog refuses
    a sensitive one there)."""
    shown = tool.approval.summary if tool.approval else []
    return {name: arguments[name] for name in shown if arguments and name in arguments}
