"""The decisions of exactly-once, without I/O (``app.calls.exactly_once``): replay, resume,
reuse, what a reconcile answer means, and release after a send. The same rules end to end,
with real processes and providers: ``test_mutations``, ``test_failures``,
``test_reconciler``."""

from __future__ import annotations

from typing import Any

import pytest

from app.calls import exactly_once
from app.calls.exactly_once import Held, Reconciled
from app.errors import IdempotencyKeyReused

REFUND = ("issue_refund", "sha256:aa")


def test_a_key_without_a_record_is_a_first_call() -> None:
    assert exactly_once.step(None, *REFUND) == "first"


@pytest.mark.parametrize("state", ["succeeded", "failed"])
def test_a_finished_record_is_only_replayed(state: Any) -> None:
    assert exactly_once.step(Held(*REFUND, state), *REFUND) == "replay"


@pytest.mark.parametrize("state", ["in_flight", "unknown"])
def test_an_open_record_whose_worker_is_gone_is_resumed(state: Any) -> None:
    assert exactly_once.step(Held(*REFUND, state), *REFUND) == "resume"


@pytest.mark.parametrize("other", [("issue_refund", "sha256:bb"), ("create_ticket", "sha256:aa")])
@pytest.mark.parametrize("state", ["in_flight", "succeeded", "failed", "unknown"])
def test_a_record_of_another_tool_or_fingerprint_is_a_reused_key_whatever_its_state(
    other: tuple[str, str], state: Any
) -> None:
    with pytest.raises(IdempotencyKeyReused):
        exactly_once.step(Held(*other, state), *REFUND)


def test_a_reconcile_404_says_the_operation_never_happened() -> None:
    assert exactly_once.reconciled(404, {"status": "succeeded"}) == "never"


@pytest.mark.parametrize(
    ("body", "outcome"),
    [
        (
            {"status": "succeeded", "provider_status": 201, "result": {"id": "r"}},
            ("succeeded", 201),
        ),
        ({"status": "failed", "provider_status": 422}, ("failed", 422)),
        ({"status": "succeeded"}, ("succeeded", 200)),
        ({"status": "failed", "provider_status": 201}, ("failed", 400)),  # not a failure's code
        ({"status": "succeeded", "provider_status": True}, ("succeeded", 200)),
        ({"status": "succeeded", "provider_status": 2**32}, ("succeeded", 200)),
    ],
)
def test_a_reconciled_outcome_keeps_only_a_status_code_of_that_outcome(
    body: dict[str, Any], outcome: tuple[str, int]
) -> None:
    said = exactly_once.reconciled(200, body)
    assert isinstance(said, Reconciled)
    assert (said.status, said.provider_status) == outcome
    assert said.result == body.get("result")


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, {"status": "pending"}),
        (200, {"status": None}),
        (200, ["succeeded"]),
        (200, None),
        (500, {"status": "succeeded"}),
        (202, {"status": "succeeded"}),
    ],
)
def test_any_other_reconcile_answer_leaves_the_outcome_unknown(status: int, body: Any) -> None:
    assert exactly_once.reconciled(status, body) == "unknown"


def test_a_first_send_that_never_left_releases_its_claim() -> None:
    assert exactly_once.after_send("not_sent", resumed=False) == "release"


def test_a_resumed_send_that_never_left_stays_unknown_as_the_first_may_have_been_sent() -> None:
    assert exactly_once.after_send("not_sent", resumed=True) == "unknown"


@pytest.mark.parametrize("sent", ["uncertain", 500, 503, 302, 101])
@pytest.mark.parametrize("resumed", [False, True])
def test_no_answer_or_an_answer_that_says_nothing_certain_is_unknown(
    sent: Any, resumed: bool
) -> None:
    assert exactly_once.after_send(sent, resumed=resumed) == "unknown"


@pytest.mark.parametrize("sent", [200, 201, 400, 404, 422])
def test_a_2xx_or_4xx_finishes_the_record(sent: int) -> None:
    assert exactly_once.after_send(sent, resumed=False) == "finish"
