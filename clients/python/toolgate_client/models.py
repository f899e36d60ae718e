"""The shapes of toolgate's answers, as the API documents them. Answers are plain JSON
(dicts), typed here so that a caller's editor and type checker know the fields; fields the
server adds later simply appear in the dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

JSON = dict[str, Any]
Format = Literal["raw", "openai", "openai-responses", "anthropic", "mcp"]
RunEnd = Literal["completed", "needs_clarification", "handed_off", "failed"]
Outside = Literal["deny", "approve"]
"""What a run's scope does with a call of a tool outside it: refuse it, or ask an approver."""


class Target(TypedDict):
    type: str
    id: str


class Taint(TypedDict):
    """An argument copied from an untrusted result of the run, and the call that returned it."""

    argument: str
    source_call_id: str


class Proposal(TypedDict):
    call_id: str
    tool: str
    decision: str
    mutation: bool
    impact: Literal["read", "low", "high"]
    next: Literal["dry_run", "approval", "execute"]
    arguments: JSON
    fingerprint: str
    target: Target | None
    policy_version: str
    proposed_by: str
    authorized_by: JSON
    taint: NotRequired[list[Taint]]


class DryRun(TypedDict):
    dry_run_id: str
    call_id: str
    snapshot: Any
    snapshot_hash: str
    expires_at: str
    next: Literal["approval", "execute"]


class Approval(TypedDict):
    approval_id: str
    call_id: str
    decision: Literal["approve", "reject"]
    expires_at: str | None
    binding: JSON


class Call(TypedDict):
    """``GET /calls/{call_id}``: a call's whole life."""

    call_id: str
    tool: str
    actor: str
    tenant: str
    run_id: str | None
    tool_call_id: str | None
    state: str
    proposal: JSON
    decisions: list[JSON]
    dry_runs: list[JSON]
    approval: JSON | None
    executions: list[JSON]
    timings: JSON
    may_decide: NotRequired[bool]


class Catalog(TypedDict):
    policy_version: str
    tools: list[JSON]


class Scope(TypedDict):
    """The tools a run may call (chosen from the user's request, before the run reads any
    data), and what a call of another tool does."""

    tools: list[str]
    outside: Outside


class Run(TypedDict):
    run_id: str
    status: str
    limits: JSON
    scope: NotRequired[Scope | None]
    task: NotRequired[str | None]
    counters: NotRequired[JSON]
    calls: NotRequired[list[JSON]]
    created_at: NotRequired[str]
    finished_at: NotRequired[str | None]
    reason: NotRequired[str | None]
    recoverable: NotRequired[bool | None]
    limit: NotRequired[str | None]


class Page(TypedDict):
    """One page of ``GET /audit``; send ``next_cursor`` back for the next (``None``: done)."""

    items: list[JSON]
    next_cursor: str | None


class AuditFilters(TypedDict, total=False):
    """Filters of the audit trail; they combine. ``since``/``until`` are RFC 3339."""

    tenant: str
    actor: str
    tool: str
    call_id: str
    run_id: str
    event: str
    since: str
    until: str


@dataclass(frozen=True)
class Execution:
    """An ``/execute`` answer, with the idempotency key it was sent under: to retry this
    same action later (say, after the process restarted), send that key again."""

    idempotency_key: str
    call_id: str
    operation_id: str | None
    status: Literal["succeeded", "failed"]
    provider_status: int
    result: Any
    trust: str
    replayed: bool
