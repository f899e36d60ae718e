"""A call's request bodies (unknown fields refused), the request as authorization sees it and
what it returns, the answer of /execute, and the stored rows."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import ConfigDict, Field, model_validator

from app import evidence
from app.auth.principal import Principal
from app.bodies import Body, Id, JsonObject
from app.calls.answers import Execution
from app.calls.policy import Decision, Facts, PreparedCall
from app.calls.states import CallState, ExecutionState, Next
from app.catalog.models import Catalog, Impact, Tool
from app.errors import IdempotencyKeyInvalid, IdempotencyKeyMissing
from app.evidence import AuthorizedBy, EndorsementItem, Taint, Target
from app.runs.models import RunRow


class ProposeBody(Body):
    tool: str = Field(min_length=1, max_length=200)
    """Not ``Text``: a name that cannot be stored is an unknown tool, recorded as such."""
    arguments: JsonObject
    run_id: Id | None = None
    tool_call_id: Id | None = None


class ExecuteBody(Body):
    """``tool`` and ``arguments`` may be left out when ``call_id`` names the call: it then
    runs with its stored tool and normalized arguments; given, they must match it."""

    tool: str | None = Field(default=None, min_length=1, max_length=200)
    arguments: JsonObject | None = None
    approval_id: Id | None = None
    dry_run_id: Id | None = None
    call_id: Id | None = None
    run_id: Id | None = None

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["call_id"], "properties": {"call_id": {"type": "string"}}},
                {
                    "required": ["tool", "arguments"],
                    "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}},
                },
            ]
        }
    )

    @model_validator(mode="after")
    def _names_a_call(self) -> ExecuteBody:
        if self.call_id is None and (self.tool is None or self.arguments is None):
            raise ValueError("tool and arguments are required unless call_id names the call")
        return self


_KEY = re.compile(r'"([A-Za-z0-9_-]{16,255})"|([A-Za-z0-9_-]{16,255})')
IDEMPOTENCY_KEY_PATTERN = r'^("[A-Za-z0-9_-]{16,255}"|[A-Za-z0-9_-]{16,255})$'
"""The same form, as the OpenAPI document states it (the header is judged by ``_KEY``)."""


class IdempotencyKey(NamedTuple):
    """The ``Idempotency-Key`` header, parsed where the request arrives: 16-255 of
    ``[A-Za-z0-9_-]``, bare or as a quoted sf-string. Only a mutation needs one, and only once
    it is authorized (a denial is answered first), so a missing or malformed header is kept
    as such and refused by ``required`` then."""

    value: str | None
    """The key; ``None`` when the header is missing or malformed."""
    given: bool

    @classmethod
    def parse(cls, header: str | None) -> IdempotencyKey:
        text = header.strip() if header is not None else ""
        match = _KEY.fullmatch(text)
        return cls((match.group(1) or match.group(2)) if match else None, bool(text))

    def required(self) -> str:
        if self.value is not None:
            return self.value
        if not self.given:
            raise IdempotencyKeyMissing("a mutation needs an Idempotency-Key header")
        raise IdempotencyKeyInvalid("Idempotency-Key must be 16-255 characters of [A-Za-z0-9_-]")


class Request(NamedTuple):
    """What one request asks of a call, with the catalog it is decided under. The app's
    catalog is read once, here: a reload while the request waits on a provider does not
    change the policy version it records."""

    principal: Principal
    catalog: Catalog
    tool_name: str
    tool: Tool | None
    """The catalog's tool of that name; ``None`` is an unknown tool, denied."""
    raw_arguments: Any
    run_id: str | None
    tool_call_id: str | None
    started: float
    """When the request began deciding (``time.perf_counter``): audit rows record the
    time since."""
    run: RunRow | None = None
    """The run ``run_id`` names, as ``authorization.with_run`` read it (its scope and task
    decide too)."""

    @property
    def run_unread(self) -> bool:
        """It names a run not read yet: a new read decided before its run, whose scope is
        judged where the call is admitted (``service.execute``)."""
        return self.run_id is not None and self.run is None

    @classmethod
    def under(
        cls,
        catalog: Catalog,
        principal: Principal,
        tool_name: str,
        raw_arguments: Any,
        run_id: str | None,
        tool_call_id: str | None = None,
    ) -> Request:
        tool = catalog.tools.get(tool_name)
        return cls(
            principal,
            catalog,
            tool_name,
            tool,
            raw_arguments,
            run_id,
            tool_call_id,
            time.perf_counter(),
        )


class Authorized(NamedTuple):
    """A request that passed authorization: what the rest of its path takes. Only
    ``authorization.authorize`` makes one; anything that sends a call to its provider needs
    one (the background reconciler, which has no verified token, never has one)."""

    request: Request
    call: PreparedCall
    decision: Decision
    facts: Facts
    """What the decision was made on (looked up once: ``authorization.on_its_run`` decides
    again on them)."""

    @property
    def principal(self) -> Principal:
        return self.request.principal

    @property
    def catalog(self) -> Catalog:
        return self.request.catalog

    @property
    def tool(self) -> Tool:
        return self.call.tool

    @property
    def tool_name(self) -> str:
        return self.call.tool.name

    @property
    def run_id(self) -> str | None:
        return self.request.run_id


class Answer(NamedTuple):
    """An /execute answer: the body, plus headers such as ``Idempotent-Replayed``."""

    body: Execution
    headers: Mapping[str, str] | None = None


class CallRow(NamedTuple):
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
    impact: Impact | None
    decision: Literal["allow", "deny"]
    code: str | None
    reason: str | None
    next: Next | None
    state: CallState
    policy_version: str
    proposed_by: Literal["model"]
    authorized_by: AuthorizedBy | None
    taint: list[Taint] | None = None
    """What the proposal found: ``[{argument, source_call_id}]`` (``None`` before 0012)."""
    pending_until: datetime | None = None
    """While awaiting approval: when its approval window passes and it leaves the inbox."""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    endorsement: list[EndorsementItem] | None = None
    """What endorses each ``x-endorsed`` argument, as the decision found it (``None``: the
    tool has none, or the call was stored before 0019)."""

    @property
    def target(self) -> Target | None:
        return evidence.target(self.target_type, self.target_id)

    def pending(self, now: datetime) -> bool:
        """Whether the call awaits a decision at ``now``: it is in the approvers' inbox."""
        return (
            self.state == "awaiting_approval"
            and self.pending_until is not None
            and self.pending_until > now
        )


class DryRunBody(Body):
    call_id: Id


class DryRunRow(NamedTuple):
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


class ExecutionSummary(NamedTuple):
    """An execution record as a call's history shows it (GET /calls/{id}): without the
    provider's answer, which the history never shows and which may be as large as a
    provider's answer may be, once per execution of the call."""

    operation_id: str
    state: ExecutionState
    provider_status: int | None
    approval_id: str | None
    created_at: datetime
    updated_at: datetime


class ExecutionRow(NamedTuple):
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
    state: ExecutionState
    provider_status: int | None
    response: Execution | None
    expires_at: datetime
    created_at: datetime | None = None
    updated_at: datetime | None = None
