"""Which gates a mutation's first execution must pass, decided once, from the frozen result
of its authorization and what the request names.

A first call on a fresh key either claims the key at once (nothing to check: one
statement, no read of its record) or passes its gates first and then claims the key in a
transaction. Both paths read this one answer (``needed``): a gate listed here is checked
for a fresh key as for any other, and a call that needs any gate never takes the fast
claim. Each gate's check lives with the execution (``mutation.CHECKS``, by name); what
decides whether it applies lives here, free of I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from app.calls.policy import Decision
from app.catalog.models import Tool


class Gated(NamedTuple):
    """What decides a first execution's gates."""

    decision: Decision
    tool: Tool
    run_id: str | None
    names_call: bool
    """The request names a call it runs (``call_id``)."""


class Gate(NamedTuple):
    name: str
    needed: Callable[[Gated], bool]


GATES: tuple[Gate, ...] = (
    # A named call runs as itself: the same tool, target and arguments, and not rejected.
    Gate("same_call", lambda g: g.names_call),
    # High impact: an approval bound to exactly this request (and, for a tool that
    # rechecks, to a preview that still stands).
    Gate("approval", lambda g: g.decision.impact == "high"),
    # ``require_dry_run``: an unexpired dry-run of these arguments (a high-impact call's
    # approval gate checks its preview itself).
    Gate("dry_run", lambda g: g.decision.impact != "high" and g.tool.require_dry_run),
    # A call in a run is admitted against the run's limits in the claim's transaction.
    Gate("run", lambda g: g.run_id is not None),
)
"""In the order they are checked."""


def needed(gated: Gated) -> tuple[str, ...]:
    """The names of the gates ``gated`` must pass, in order; none: the key may be claimed
    before anything is read."""
    return tuple(gate.name for gate in GATES if gate.needed(gated))
