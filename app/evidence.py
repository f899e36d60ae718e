"""What a decision found about a call, as answers show it and rows keep it: the resource it
acts on, the arguments a run's untrusted results tainted, what endorses each ``x-endorsed``
argument, who authorized it, and what an approval of it binds. Every layer carries these, so
they sit below all of them; their names are those of the OpenAPI document's schemas."""

from __future__ import annotations

from typing import Literal, NotRequired

from typing_extensions import TypedDict


class Target(TypedDict):
    """The resource a call acts on, as the tool's catalog entry names it."""

    type: str
    id: str


def target(kind: str | None, id_: str | None) -> Target | None:
    """The target a row keeps as two columns (``target_type``, ``target_id``); ``None``
    unless both are set."""
    return {"type": kind, "id": id_} if kind is not None and id_ is not None else None


class AuthorizedBy(TypedDict):
    """Who let the call go this far: the policy (for the actor), or an approval."""

    kind: Literal["policy", "approval"]
    sub: str
    tenant: str
    policy_version: str
    approval_id: NotRequired[str | None]


class Taint(TypedDict):
    """An argument holding a value an untrusted result of the same run returned, and the
    call that returned it."""

    argument: str
    source_call_id: str


class EndorsementItem(TypedDict):
    """What endorses an ``x-endorsed`` argument: the run's ``task``, a ``trusted_result``
    of the run, or a ``known`` value of the tenant; ``null`` with ``endorsed: false`` when
    nothing does (``reason`` says why), or with ``endorsed: true`` when its text holds no
    link to judge. Never a value."""

    argument: str
    source: Literal["task", "trusted_result", "known"] | None
    endorsed: bool
    reason: NotRequired[str | None]


class Binding(TypedDict):
    """What an approval covers; change any part and it no longer applies."""

    actor: str
    tenant: str
    tool: str
    target: Target | None
    policy_version: str
    fingerprint: str
    snapshot_hash: str | None
