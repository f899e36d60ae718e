"""The decisions of exactly-once, free of I/O: what a key's record asks of a request, what a
provider's reconcile answer means, and what a send's outcome leaves to do. ``mutation``
carries them out (locks, statements, provider calls); these are what its tests pin in
milliseconds.

The rules: a key's record belongs to one tool and fingerprint, and is never used for
another; a finished record is only replayed; an open record whose worker is gone is
asked about before anything is sent again; a request that certainly never left frees its
key (and its approval) only while the record is still its own; anything that may have
reached the provider is an unknown outcome, never "nothing ran".
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from app.calls.results import classify
from app.calls.states import ExecutionState, Finished
from app.errors import IdempotencyKeyReused

Step = Literal["first", "replay", "resume"]
FINISHED: tuple[ExecutionState, ...] = ("succeeded", "failed")


class Held(NamedTuple):
    """What the step of a key depends on, of the record it holds."""

    tool: str
    fingerprint: str
    state: ExecutionState


def step(record: Held | None, tool: str, fingerprint: str) -> Step:
    """What a request on a key does: a first call when the key holds no record, a replay of a
    finished one, a resume of an open one (in flight or unknown: its worker is gone, since
    the request holds the key's lock). A record of another tool or fingerprint is a reused
    key, refused."""
    if record is None:
        return "first"
    if (record.tool, record.fingerprint) != (tool, fingerprint):
        raise IdempotencyKeyReused(
            "this Idempotency-Key was used for another tool, target or arguments"
        )
    return "replay" if record.state in FINISHED else "resume"


class Reconciled(NamedTuple):
    """A finished outcome the provider reported for an operation."""

    status: Finished
    provider_status: int
    result: Any


Never = Literal["never"]
"""The provider never saw the operation: it may be sent (with the same operation id)."""
Unknown = Literal["unknown"]
"""No usable answer: the outcome stays unknown."""


def reconciled(status: int, body: Any) -> Reconciled | Never | Unknown:
    """What a ``reconcile`` endpoint's answer says: 404, never seen; 200 with ``status``
    ``succeeded`` or ``failed``, that outcome (with its ``provider_status`` when that is an
    HTTP status of the same outcome, else a plain 200 or 400); anything else, unknown."""
    if status == 404:
        return "never"
    fields = body if isinstance(body, dict) else {}
    outcome = fields.get("status")
    if status != 200 or outcome not in FINISHED:
        return "unknown"
    provider_status = fields.get("provider_status")
    if type(provider_status) is not int or classify(provider_status) != outcome:
        # none, or not an HTTP status of that outcome (a boolean, 2**32, a 4xx success)
        provider_status = 200 if outcome == "succeeded" else 400
    return Reconciled(outcome, provider_status, fields.get("result"))


Sent = Literal["not_sent", "uncertain"] | int
"""How a send ended: certainly not sent, perhaps sent with no answer, or the provider's
status."""
After = Literal["release", "unknown", "finish"]


def after_send(sent: Sent, *, resumed: bool) -> After:
    """What a send's outcome leaves to do: a first send that certainly never left releases
    its claim (a resumed one may have been sent before, by the worker that is gone: it stays
    unknown); no answer, or one that says nothing certain (5xx, a redirect), is unknown; a
    2xx or 4xx finishes the record."""
    if sent == "not_sent":
        return "unknown" if resumed else "release"
    if sent == "uncertain" or classify(sent) == "unknown":
        return "unknown"
    return "finish"
