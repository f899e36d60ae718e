"""The compiled catalog: frozen values the request path reads and never changes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import cel
import jsonschema_rs
import orjson

from app.catalog.spec import AccessSpec, ApprovalSpec, Method, ResultSpec
from app.catalog.trusted import FieldPath

Impact = Literal["read", "low", "high"]
OnTaint = Literal["approve", "deny", "allow"]
OnUnendorsed = Literal["approve", "deny"]
ACTOR = "actor"
"""In ``approval.approvers``: the call's own actor may approve it."""
EndorsedMode = Literal["value", "links"]


class Endorsed(NamedTuple):
    """An ``x-endorsed`` argument: its name, what is judged (``value``: the whole value;
    ``links``: every URL, host name and e-mail address in its text), the kind of known
    values that endorse it (``x-endorsed-kind``, default ``<tool>.<argument>``), and
    whether it is a list whose items are judged each on its own (``many``)."""

    argument: str
    mode: EndorsedMode
    kind: str
    many: bool = False


@dataclass(frozen=True)
class Provider:
    name: str
    base_url: str
    timeout_s: float
    headers: Mapping[str, str]
    max_response_bytes: int


@dataclass(frozen=True)
class Endpoint:
    method: Method
    path: str
    placeholders: tuple[str, ...]


@dataclass(frozen=True)
class Resource:
    type: str
    provider: Provider
    owner: Endpoint


class Owner(NamedTuple):
    """Whom a resource belongs to, as its provider's ``owner`` endpoint answers."""

    tenant: str
    user: str | None


def argument_text(value: Any) -> str:
    """An argument as an endpoint's URL carries it: a string as is, anything else as JSON.
    The one definition both the URL builder and policy's path-segment check use."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    mutation: bool
    provider: Provider
    execute: Endpoint
    dry_run: Endpoint | None
    reconcile: Endpoint | None
    require_dry_run: bool
    impact: Impact
    high_impact_when: cel.Program | None
    approval: ApprovalSpec | None
    recheck: bool
    """Preview an approved call again before it runs (``approval.recheck``, resolved)."""
    on_taint: OnTaint
    """What a tainted argument in a run does (``on_taint``, resolved)."""
    endorsed_args: tuple[Endorsed, ...]
    """``x-endorsed`` arguments, in schema order."""
    on_unendorsed: OnUnendorsed
    """What an unendorsed argument does (``on_unendorsed``, resolved)."""
    access: AccessSpec
    cost: float
    parameters: Mapping[str, Any]
    """The schema as the catalog wrote it, annotations included."""
    public_parameters: Mapping[str, Any]
    """The schema a model is shown (tool listings): without ``x-identity`` arguments, which
    toolgate fills in from the token, and with every ``x-`` annotation stripped."""
    validator: jsonschema_rs.Draft202012Validator
    identity_args: Mapping[str, Literal["user", "tenant"]]
    resource_args: tuple[tuple[str, Resource], ...]
    """``x-resource`` arguments in schema order; the first present one is the target."""
    egress_args: tuple[str, ...]
    path_args: frozenset[str]
    """Arguments written into a URL path: placeholders of ``execute`` and ``dry_run``, and
    ``x-resource`` arguments whose owner lookup path names the id."""
    sensitive_args: frozenset[str]
    declared_keys: frozenset[str]
    """Every property name ``parameters`` declares, at any depth: keys provenance does not
    judge (``app.runs.provenance.candidates``)."""
    result: ResultSpec
    """As the catalog wrote it; ``trusted`` is its ``trusted``, compiled."""
    trusted: tuple[FieldPath, ...]
    """Where the values are that endorse later calls in a run (``app.catalog.trusted``):
    ``WHOLE`` for ``trusted: true``, ``()`` for an untrusted tool (every mutation)."""


@dataclass(frozen=True)
class Webhook:
    """A ``notify`` entry, its URL interpolated and its secret read from the environment."""

    url: str
    events: frozenset[str]
    secret: str = field(repr=False)


@dataclass(frozen=True)
class Catalog:
    label: str
    policy_version: str
    tools: Mapping[str, Tool]
    webhooks: tuple[Webhook, ...] = ()
    warnings: tuple[str, ...] = ()
    """What ``toolgate check`` points out in the catalog without refusing it."""

    def subscribers(self, event: str) -> tuple[str, ...]:
        """The URLs told of ``event``: empty (and nothing to store) in most catalogs."""
        return tuple(w.url for w in self.webhooks if event in w.events)
