"""The names a call's life is told in, defined once: what a call needs next, the states of a
call and of its execution record, and the groups of call states the rules test.

A call: proposed (or denied) → previewed | awaiting_approval → approved | rejected →
executing → succeeded | failed | unknown. Re-authorization may deny a call on the way; an
execution that certainly never reached the provider goes back to approved or proposed. An
execution record: in_flight → succeeded | failed | unknown, and unknown → succeeded | failed
only through reconciliation.
"""

from __future__ import annotations

from typing import Literal

Next = Literal["execute", "dry_run", "approval"]
"""What a call needs before it can run."""
CallState = Literal[
    "proposed",
    "denied",
    "previewed",
    "awaiting_approval",
    "approved",
    "rejected",
    "executing",
    "succeeded",
    "failed",
    "unknown",
]
ExecutionState = Literal["in_flight", "succeeded", "failed", "unknown"]
Outcome = Literal["succeeded", "failed", "unknown"]
"""What became of an execution: the provider did it, refused it, or nobody can tell yet."""
Finished = Literal["succeeded", "failed"]
"""An outcome the provider told: what an execution's answer says (``Execution.status``)."""

STARTED: tuple[CallState, ...] = ("executing", "succeeded", "failed", "unknown")
"""An execution has claimed the call: it is not decided again."""
SETTLED: tuple[CallState, ...] = ("approved", "rejected", *STARTED)
"""A human has decided or an execution has begun: a new preview does not reopen the call."""
FINAL: tuple[CallState, ...] = ("rejected", *STARTED)
"""No later decision changes the call's state (a denial is still audited)."""
OUTCOMES: tuple[CallState, ...] = ("rejected", "succeeded", "failed", "unknown")
"""``FINAL`` but ``executing``: what an execution's own outcome does not overwrite."""
