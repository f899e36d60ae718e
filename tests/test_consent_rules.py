"""The approval rules without I/O (``app.consent.rules``): which decision stands, whether a
new decision may be stored, and whether an approval lets an execution run. End to end:
``test_approvals_once``, ``test_mutations``, ``test_stale_approvals``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.consent import rules
from app.consent.models import ApprovalRow
from app.errors import (
    ApprovalConsumed,
    ApprovalExpired,
    ApprovalMismatch,
    ApprovalRejected,
    ApprovalRequired,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def approval(**changes: Any) -> ApprovalRow:
    row = ApprovalRow(
        id="apr_1",
        call_id="call_1",
        decision="approve",
        approver="bob",
        comment=None,
        actor="alice",
        tenant="acme",
        tool="issue_refund",
        target_type="order",
        target_id="ord_1",
        policy_version="v1",
        fingerprint="sha256:aa",
        snapshot_hash="sha256:s1",
        expires_at=NOW + timedelta(minutes=5),
    )
    return row._replace(**changes)


def presented(**changes: Any) -> rules.Presented:
    base = rules.Presented("acme", True, None, approval().binding, older_preview=False)
    return base._replace(**changes)


def test_an_approval_bound_to_exactly_this_request_is_usable() -> None:
    assert rules.usable(approval(), presented(), NOW) == approval()


@pytest.mark.parametrize(
    ("row", "shown", "refusal"),
    [
        (None, presented(), ApprovalRequired),
        (approval(tenant="globex"), presented(), ApprovalRequired),
        (approval(), presented(call_id="call_2"), ApprovalRequired),
        (approval(decision="reject"), presented(), ApprovalRejected),
        (approval(expires_at=NOW), presented(), ApprovalExpired),
        (approval(fingerprint="sha256:bb"), presented(), ApprovalMismatch),
        (approval(), presented(older_preview=True), ApprovalMismatch),
    ],
)
def test_anything_else_is_refused_with_its_own_code(
    row: ApprovalRow | None, shown: rules.Presented, refusal: type[Exception]
) -> None:
    with pytest.raises(refusal):
        rules.usable(row, shown, NOW)


def test_a_mismatch_names_what_differs() -> None:
    with pytest.raises(ApprovalMismatch) as refused:
        rules.usable(approval(fingerprint="sha256:bb"), presented(older_preview=True), NOW)
    assert refused.value.extra["mismatch"] == ["arguments", "snapshot_hash"]


def test_a_used_approval_is_refused_last() -> None:
    with pytest.raises(ApprovalConsumed):
        rules.unused(approval(consumed_by="op_1"))


def test_a_rejection_stands_first_then_the_latest_unused_approval() -> None:
    rejected = approval(id="apr_r", decision="reject")
    older, newer = approval(id="apr_a"), approval(id="apr_b")
    assert rules.standing_approval([rejected, older]) == rejected
    assert rules.standing_approval([older, newer]) == newer
    used = newer._replace(consumed_by="op")
    assert rules.standing_approval([used]) == used
    assert rules.standing_approval([]) is None


def test_a_double_click_repeats_the_stored_decision_and_another_is_refused() -> None:
    stored = approval()
    assert rules.repeated(approval(id="apr_again"), False, [stored]) == stored
    with pytest.raises(ApprovalConsumed):
        rules.repeated(approval(id="apr_2", approver="carl"), False, [stored])
    with pytest.raises(ApprovalRejected):
        rules.repeated(approval(id="apr_2"), False, [approval(decision="reject")])
    with pytest.raises(ApprovalConsumed):
        rules.repeated(approval(id="apr_2"), True, [])


def test_an_approval_of_another_preview_no_longer_stands_in_the_way() -> None:
    stale = approval(snapshot_hash="sha256:old")
    assert rules.repeated(approval(id="apr_2"), False, [stale]) is None


def test_a_quorum_takes_one_approval_from_each_approver_and_then_no_more() -> None:
    bob = approval()
    assert rules.repeated(approval(id="apr_2", approver="carl"), False, [bob], quorum=2) is None
    assert rules.repeated(approval(id="apr_again"), False, [bob], quorum=2) == bob  # a double click
    with pytest.raises(ApprovalConsumed):  # bob changing his mind while his approval lives
        rules.repeated(approval(id="apr_2", decision="reject"), False, [bob], quorum=2)
    carl = approval(id="apr_2", approver="carl")
    with pytest.raises(ApprovalConsumed):
        rules.repeated(approval(id="apr_3", approver="dora"), False, [bob, carl], quorum=2)
    veto = approval(id="apr_3", approver="dora", decision="reject")
    assert rules.repeated(veto, False, [bob], quorum=2) is None  # any one may reject


def test_a_quorum_counts_approvers_who_agree_on_the_same_binding_and_are_live() -> None:
    bob, carl = approval(), approval(id="apr_2", approver="carl")
    assert rules.agreeing(bob, [bob, carl], NOW) == {"bob", "carl"}
    other_preview = carl._replace(snapshot_hash="sha256:s2")
    expired = carl._replace(expires_at=NOW)
    assert rules.agreeing(bob, [bob, other_preview], NOW) == {"bob"}
    assert rules.agreeing(bob, [bob, expired], NOW) == {"bob"}
    used = [bob._replace(consumed_by="op_1"), carl._replace(consumed_by="op_1")]
    assert rules.agreeing(used[0], used, NOW) == {"bob", "carl"}  # what ran on both
    assert rules.quorate(bob, [bob, carl], 2, NOW) == bob
    with pytest.raises(ApprovalRequired) as short:
        rules.quorate(bob, [bob, expired], 2, NOW)
    assert short.value.extra["approvals"] == "1/2"
    with pytest.raises(ApprovalRejected):
        rules.quorate(bob, [bob, carl, approval(id="apr_3", decision="reject")], 2, NOW)
    with pytest.raises(ApprovalConsumed):  # another execution used them after bob's was read
        rules.quorate(bob, used, 2, NOW)


def test_a_quorum_vouches_only_for_what_all_its_approvers_asked_and_an_actor_only_for_self() -> (
    None
):
    bob = approval(remember=["recipient", "message"])
    fiona = approval(id="apr_2", approver="fiona", remember=["message"], expires_at=NOW)
    assert rules.vouched([bob, fiona]) == rules.Vouched(["message"], None, NOW)
    assert rules.vouched([bob, fiona._replace(remember=None)]).arguments == []
    own = rules.vouched([approval(approver="alice", remember=["recipient"])])
    assert (own.arguments, own.user) == (["recipient"], "alice")
