"""Run bodies, limits and rows."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, NamedTuple, NotRequired

from pydantic import Field, StringConstraints
from typing_extensions import TypedDict

from app.bodies import Body, Text
from app.calls.answers import Timestamp

FINISHED = ("completed", "needs_clarification", "handed_off", "failed")


class Limits(Body):
    """Requested limits; each is capped by the server maximum, which it can never raise."""

    max_calls: int | None = Field(default=None, ge=1)
    max_seconds: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, ge=0)
    max_repeats: int | None = Field(default=None, ge=1)
    max_failures: int | None = Field(default=None, ge=1)


SERVER_MAXIMA = {
    "max_calls": 200,
    "max_seconds": 3600,
    "max_cost": 100.0,
    "max_repeats": 3,
    "max_failures": 10,
}


class Scope(Body):
    """The tools a run may call, chosen from the human's request before the run reads
    anything: a call of another tool is refused (``deny``, ``out_of_scope``) or needs an
    approval (``approve``)."""

    tools: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = Field(
        max_length=500
    )
    """Tool names as the catalog writes them (1-64 letters, digits, ``_`` or ``-``)."""
    outside: Literal["deny", "approve"] = "deny"


class RunBody(Body):
    task: Text | None = Field(default=None, max_length=2000)
    limits: Limits = Field(default_factory=Limits)
    scope: Scope | None = None


class ScopeBody(Body):
    """``PATCH /runs/{id}``: a narrower scope (a subset of the tools; ``approve`` may become
    ``deny``, never the reverse)."""

    scope: Scope


Ended = Literal["completed", "needs_clarification", "handed_off", "failed"]
RunStatus = Literal["active", "completed", "needs_clarification", "handed_off", "failed"]
"""A run's ``status`` as stored: active, or how it ended."""


class FinishBody(Body):
    status: Ended
    reason: Text | None = Field(default=None, max_length=2000)


class RunRow(NamedTuple):
    id: str
    tenant: str
    actor: str
    task: str | None
    status: RunStatus
    recoverable: bool | None
    reason: str | None
    limit_name: str | None
    max_calls: int
    max_seconds: int
    max_cost: float
    max_repeats: int
    max_failures: int
    calls: int = 0
    cost: float = 0.0
    failures: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    task_form: str | None = None
    """The task in comparison form (``endorsement.formed``), judged against without forming
    it again on every call."""
    scope_tools: list[str] | None = None
    """The tools the run may call; ``None``: any."""
    scope_outside: Literal["deny", "approve"] | None = None
    """What a call of another tool does: ``deny`` or ``approve``."""

    @property
    def limits(self) -> RunLimits:
        return {
            "max_calls": self.max_calls,
            "max_seconds": self.max_seconds,
            "max_cost": self.max_cost,
            "max_repeats": self.max_repeats,
            "max_failures": self.max_failures,
        }

    @property
    def scope(self) -> RunScope | None:
        if self.scope_tools is None:
            return None
        return {"tools": self.scope_tools, "outside": self.scope_outside or "deny"}


# --- answers, as the OpenAPI document describes them (``app.calls.answers``) ----------------


class RunLimits(TypedDict):
    max_calls: int
    max_seconds: int
    max_cost: float
    max_repeats: int
    max_failures: int


class RunScope(TypedDict):
    tools: list[str]
    outside: Literal["deny", "approve"]


class RunCreated(TypedDict):
    """``POST /runs``: the run, with the limits in force (never above the server's), and its
    scope (``null``: any tool)."""

    run_id: str
    status: Literal["active"]
    limits: RunLimits
    scope: NotRequired[RunScope | None]


class RunCall(TypedDict):
    """One call made in a run, as ``GET /runs/{id}`` lists it."""

    call_id: str
    tool: str
    decision: str
    code: str | None
    state: str
    impact: str | None
    created_at: Timestamp


class RunCounters(TypedDict):
    calls: int
    cost: float
    failures: int
    seconds: float


class Run(TypedDict):
    """``GET /runs/{run_id}`` and ``POST /runs/{run_id}/finish``. An ended run also has
    ``reason``, ``recoverable`` and ``limit`` (the limit that ended it, if one did)."""

    run_id: str
    task: str | None
    scope: NotRequired[RunScope | None]
    status: Literal[
        "active", "awaiting_approval", "completed", "needs_clarification", "handed_off", "failed"
    ]
    limits: RunLimits
    counters: RunCounters
    calls: list[RunCall]
    created_at: Timestamp | None
    finished_at: Timestamp | None
    reason: NotRequired[str | None]
    recoverable: NotRequired[bool | None]
    limit: NotRequired[str | None]
