"""The approval rules, in one place and free of I/O: who may decide a call, which of a
call's decisions stands, whether a new decision may be stored, and whether an approval
lets an execution run. Both the approvers' use cases (``app.approvals``) and the call path
(``app.calls``) read them; this package imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from app.auth.principal import Principal
from app.catalog.models import ACTOR, Tool
from app.consent.models import ApprovalRow, differences
from app.errors import (
    ApprovalConsumed,
    ApprovalExpired,
    ApprovalMismatch,
    ApprovalRejected,
    ApprovalRequired,
)
from app.evidence import Binding


def may_approve(approver: Principal, actor: str, tenant: str, approvers: list[str]) -> bool:
    """Whether ``approver`` may decide a call of ``actor`` in ``tenant``.

    Same tenant only; ``actor`` lets the actor approve their own call; ``role:<name>`` lets a
    holder of that role approve, but never their own call unless ``actor`` is listed too.
    """
    if approver.tenant != tenant:
        return False
    if approver.sub == actor:
        return ACTOR in approvers
    return _admits_role(approver, approvers)


def _admits_role(approver: Principal, approvers: list[str]) -> bool:
    return any(
        entry.startswith("role:") and entry[len("role:") :] in approver.roles for entry in approvers
    )


class Decidable(NamedTuple):
    """The calls of their tenant ``approver`` may decide, by tool: calls of a tool in
    ``others`` made by anyone else, and calls of a tool in ``own`` made by ``approver``."""

    approver: str
    others: list[str]
    own: list[str]


def decidable(approver: Principal, tools: Mapping[str, Tool]) -> Decidable:
    """``may_approve`` over a catalog, for a query that reads only what the approver may decide
    (the inbox): within the approver's tenant it depends on the call's tool and on whether
    the approver is its actor, nothing else."""
    approvals = {name: tool.approval.approvers for name, tool in tools.items() if tool.approval}
    return Decidable(
        approver.sub,
        others=[name for name, approvers in approvals.items() if _admits_role(approver, approvers)],
        own=[name for name, approvers in approvals.items() if ACTOR in approvers],
    )


def repeated(
    new: ApprovalRow, started: bool, standing: list[ApprovalRow], quorum: int = 1
) -> ApprovalRow | None:
    """The stored decision that ``new`` repeats (a double click gets the first one's answer),
    or ``None`` when ``new`` may be stored. A call is decided once: it holds at most
    ``quorum`` live approvals, each by another approver, a rejection is final, and a call
    that has run or is running (``started``) is not decided again. ``standing`` must be read
    under the call's lock, so concurrent decisions take turns. An unused approval of another
    preview than ``new``'s no longer stands: the world changed since (a stale approval), and
    it can only run if the latest preview is its own again."""
    if started or any(a.consumed_by is not None for a in standing):
        raise ApprovalConsumed(
            "this call has already been executed; it cannot be decided again", call_id=new.call_id
        )
    standing = [
        a for a in standing if a.decision == "reject" or a.snapshot_hash == new.snapshot_hash
    ]
    decided = [a for a in standing if a.decision == "reject" or a.approver == new.approver]
    prior = decided[0] if decided else None
    if prior is not None:
        if (prior.approver, prior.decision, prior.binding) == (
            new.approver,
            new.decision,
            new.binding,
        ):
            return prior
        if prior.decision == "reject":
            raise ApprovalRejected(
                "this call was rejected; a rejection is final", call_id=new.call_id
            )
        raise ApprovalConsumed(
            "you have already decided this call; it can be decided again once that expires",
            call_id=new.call_id,
        )
    if len(standing) >= quorum:
        raise ApprovalConsumed(
            "this call already holds its live approvals; it can be decided again once they expire",
            call_id=new.call_id,
        )
    return None


def quorum(tool: Tool) -> int:
    """How many approvers must agree for a call of ``tool`` to run."""
    return tool.approval.quorum if tool.approval is not None else 1


def agreeing(approval: ApprovalRow, decided: list[ApprovalRow], now: datetime) -> frozenset[str]:
    """The approvers of a call's ``decided`` approvals that agree with ``approval``: bound to
    exactly what it binds, and unused and live at ``now``, or used by the same execution.
    What a quorum counts."""
    return frozenset(a.approver for a in concurring(approval, decided, now))


def concurring(
    approval: ApprovalRow, decided: list[ApprovalRow], now: datetime
) -> list[ApprovalRow]:
    """The approvals ``agreeing`` counts."""
    return [
        a
        for a in decided
        if a.decision == "approve"
        and a.binding == approval.binding
        and (
            a.consumed_by == approval.consumed_by
            if approval.consumed_by is not None
            else a.consumed_by is None and a.expires_at > now
        )
    ]


class Vouched(NamedTuple):
    """What the approvals that make up a call's quorum vouch for (``remember``)."""

    arguments: list[str]
    """The arguments every one of them asked to remember."""
    user: str | None
    """The call's actor when one of them is the actor (scope ``user``: the values endorse
    only the actor's own later calls); ``None``: the tenant's (scope ``tenant``)."""
    until: datetime
    """When the first of them lapses: their call can run no later, unless it has started."""


def vouched(quorum: list[ApprovalRow]) -> Vouched:
    """What a call's full ``quorum`` of approvals (one or more) vouches for. Only every
    approver together makes a value known, as only all of them together let the call run:
    one approver's ``remember`` is not the quorum's. A user who approves their own call
    (``actor`` among the approvers) vouches for themselves only, never for the tenant."""
    first, *others = quorum
    return Vouched(
        arguments=[
            name for name in first.remember or [] if all(name in (a.remember or []) for a in others)
        ],
        user=next((a.actor for a in quorum if a.approver == a.actor), None),
        until=min(a.expires_at for a in quorum),
    )


def standing_approval(standing: list[ApprovalRow]) -> ApprovalRow | None:
    """The approval an execution by call id alone runs on, of the call's ``standing``
    decisions (a rejection first): its rejection, which is final; else its latest unused live
    approval; else the latest used one (answered as consumed)."""
    if not standing or standing[0].decision == "reject":
        return standing[0] if standing else None
    unused = [approval for approval in standing if approval.consumed_by is None]
    return (unused or standing)[-1]


class Presented(NamedTuple):
    """What an execution presents an approval with, and what it is held against."""

    tenant: str
    """The executing principal's."""
    named: bool
    """The request named the approval (``approval_id``), rather than only its call."""
    call_id: str | None
    """The call the request names, if it names one."""
    current: Binding
    """This request's binding, against its call's latest preview."""
    older_preview: bool
    """The request names a dry-run older than its call's latest."""


def usable(approval: ApprovalRow | None, presented: Presented, now: datetime) -> ApprovalRow:
    """``approval`` if it lets the presented execution run: an approval of this tenant's
    call (the one the request names, when it names one), not a rejection, unexpired, and
    bound to exactly this request on its call's latest preview. Being unused is judged
    last (``unused``), after whatever the tool checks of the preview itself."""
    if approval is None or approval.tenant != presented.tenant:
        raise ApprovalRequired(
            "no such approval" if presented.named else "no approval of this call"
        )
    if presented.call_id not in (None, approval.call_id):
        raise ApprovalRequired("the approval was given for another call")
    if approval.decision == "reject":
        raise ApprovalRejected("the approver rejected this call")
    if approval.expires_at <= now:
        raise ApprovalExpired("the approval has expired")
    mismatch = differences(approval.binding, presented.current)
    if presented.older_preview and "snapshot_hash" not in mismatch:
        mismatch.append("snapshot_hash")
    if mismatch:
        raise ApprovalMismatch(
            "the approval was given for something else: " + ", ".join(mismatch),
            mismatch=mismatch,
        )
    return approval


def quorate(
    approval: ApprovalRow, decided: list[ApprovalRow], needed: int, now: datetime
) -> ApprovalRow:
    """``approval`` if enough of its call's ``decided`` approvals agree with it (``agreeing``):
    with a quorum, one approval of several lets nothing run. A call rejected, or run on its
    approvals meanwhile, is refused as such."""
    if any(a.decision == "reject" for a in decided):
        raise ApprovalRejected("an approver rejected this call", call_id=approval.call_id)
    if any(a.consumed_by is not None for a in decided):  # read after ``approval`` was
        raise ApprovalConsumed("the approvals were used by another execution")
    given = len(agreeing(approval, decided, now))
    if given < needed:
        raise ApprovalRequired(
            f"{given} of the {needed} approvals this call needs have been given",
            call_id=approval.call_id,
            approvals=f"{given}/{needed}",
        )
    return approval


def unused(approval: ApprovalRow) -> ApprovalRow:
    if approval.consumed_by is not None:
        raise ApprovalConsumed("the approval was used by another execution")
    return approval
