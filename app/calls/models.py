"""Request bodies (unknown fields refused) and the stored call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import Field

from app.bodies import Body, JsonObject, Text


class ProposeBody(Body):
    tool: str = Field(min_length=1, max_length=200)
    """Not ``Text``: a name that cannot be stored is an unknown tool, recorded as such."""
    arguments: JsonObject
    run_id: Text | None = Field(default=None, max_length=200)
    tool_call_id: Text | None = Field(default=None, max_length=200)


class ExecuteBody(Body):
    tool: str = Field(min_length=1, max_length=200)
    arguments: JsonObject
    approval_id: Text | None = Field(default=None, max_length=200)
    dry_run_id: Text | None = Field(default=None, max_length=200)
    call_id: Text | None = Field(default=None, max_length=200)
    run_id: Text | None = Field(default=None, max_length=200)


# A call's life (``calls.state``): proposed → previewed | awaiting_approval → approved |
# rejected → executing → succeeded | failed | unknown. Re-authorization may deny a call on
# the way; an execution that certainly never reached the provider goes back to approved or
# proposed.
STARTED = ("executing", "succeeded", "failed", "unknown")
"""An execution has claimed the call: it is not decided again."""
SETTLED = ("approved", "rejected", *STARTED)
"""A human has decided or an execution has begun: a new preview does not reopen the call."""
FINAL = ("rejected", *STARTED)
"""No later decision changes the call's state (a denial is still audited)."""


@dataclass(frozen=True)
class CallRow:
    id: str
    tenant: str
    actor: str
    tool: str
    run_id: str | None
    tool_call_id: str | None
    arguments: dict[str, Any] | None
    fingerprint: str | None
    target_type: str | None
    target_id: str | None
    mutation: bool | None
    impact: str | None
    decision: str
    code: str | None
    reason: str | None
    next: str | None
    state: str
    policy_version: str
    proposed_by: str
    authorized_by: dict[str, Any] | None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def target(self) -> dict[str, str] | None:
        if self.target_type is None or self.target_id is None:
            return None
        return {"type": self.target_type, "id": self.target_id}


class DryRunBody(Body):
    call_id: Text = Field(min_length=1, max_length=200)


@dataclass(frozen=True)
class DryRunRow:
    id: str
    call_id: str
    tenant: str
    actor: str
    tool: str
    fingerprint: str
    policy_version: str
    snapshot: Any
    snapshot_hash: str
    expires_at: datetime
    created_at: datetime | None = None


@dataclass(frozen=True)
class ExecutionRow:
    operation_id: str
    tenant: str
    actor: str
    idempotency_key: str
    call_id: str
    tool: str
    target_type: str | None
    target_id: str | None
    fingerprint: str
    approval_id: str | None
    state: str
    provider_status: int | None
    response: dict[str, Any] | None
    expires_at: datetime
    created_at: datetime | None = None
    updated_at: datetime | None = None
