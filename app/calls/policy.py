"""The authorization decision as pure functions: no I/O, no clock, no database.

The service gathers facts (resource owners, resolved egress addresses) and asks ``decide``;
everything here is a function of (principal, tool, arguments, facts), which is what most
tests exercise.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import rfc8785

from app import recordable
from app.auth.principal import Principal
from app.canonical import digest
from app.catalog.models import Impact, Resource, Tool
from app.errors import IdentitySpoof, InvalidArguments, ToolForbidden

Next = Literal["execute", "dry_run", "approval"]
NOT_ACCESSIBLE = "a resource named in the arguments is not accessible to this session"


@dataclass(frozen=True)
class Target:
    type: str
    id: str

    def as_dict(self) -> dict[str, str]:
        return {"type": self.type, "id": self.id}


@dataclass(frozen=True)
class Owner:
    tenant: str
    user: str | None


@dataclass(frozen=True)
class PreparedCall:
    """A call whose arguments passed the schema: normalized, fingerprinted, targeted."""

    tool: Tool
    arguments: dict[str, Any]
    fingerprint: str
    target: Target | None
    resources: tuple[tuple[str, Resource, str], ...]
    """(argument, resource type, id) for every ``x-resource`` argument present."""
    egress: tuple[tuple[str, str], ...]
    """(argument, URL) for every ``x-egress`` argument present."""


@dataclass(frozen=True)
class Facts:
    """What the service looked up just now for this decision."""

    owners: Mapping[str, Owner | None]
    """Owner per ``x-resource`` argument; ``None`` when missing (or not ours to know)."""
    addresses: Mapping[str, tuple[str, ...]]
    """Resolved addresses per ``x-egress`` argument; empty when resolution failed."""


@dataclass(frozen=True)
class Decision:
    impact: Impact
    next: Next


def fingerprint(tool: str, target: Target | None, arguments: Mapping[str, Any]) -> str:
    document = {
        "tool": tool,
        "target": target.as_dict() if target else None,
        "arguments": arguments,
    }
    return digest(document)


def prepare(tool: Tool, raw: Any) -> PreparedCall:
    """Validate arguments against the tool's schema, filling defaults; raise on any error.
    Arguments that cannot be stored or canonicalized (``recordable``) are refused first."""
    if not isinstance(raw, dict):
        raise InvalidArguments(
            "arguments must be a JSON object", errors=[{"path": "", "message": "not an object"}]
        )
    unfit = recordable.problems(raw)
    if unfit:
        raise InvalidArguments("arguments hold values that cannot be recorded", errors=unfit)
    arguments = _with_defaults(tool.parameters, copy.deepcopy(raw))
    errors = [
        {"path": "/" + "/".join(str(p) for p in e.instance_path), "message": e.message}
        for e in tool.validator.iter_errors(arguments)
    ]
    if errors:
        raise InvalidArguments("arguments do not match the tool's schema", errors=errors)
    resources = tuple(
        (arg, resource, arguments[arg])
        for arg, resource in tool.resource_args
        if isinstance(arguments.get(arg), str)
    )
    target = Target(resources[0][1].type, resources[0][2]) if resources else None
    try:
        digest = fingerprint(tool.name, target, arguments)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidArguments(
            "arguments cannot be canonicalized", errors=[{"path": "", "message": str(exc)}]
        ) from None
    return PreparedCall(
        tool=tool,
        arguments=arguments,
        fingerprint=digest,
        target=target,
        resources=resources,
        egress=tuple(
            (arg, arguments[arg]) for arg in tool.egress_args if isinstance(arguments.get(arg), str)
        ),
    )


def _with_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    for name, prop in schema.get("properties", {}).items():
        if not isinstance(prop, dict):
            continue
        if name not in value and "default" in prop:
            value[name] = copy.deepcopy(prop["default"])
        if name in value:
            value[name] = _with_defaults(prop, value[name])
    return value


def precheck(principal: Principal, call: PreparedCall) -> None:
    """The checks that need no lookups: identity, then roles. Raises the denial."""
    for arg, kind in call.tool.identity_args.items():
        if arg not in call.arguments:
            continue
        expected = principal.sub if kind == "user" else principal.tenant
        if call.arguments[arg] != expected:
            raise IdentitySpoof(f"argument {arg!r} must name the session's own {kind}")
    roles = call.tool.access.roles
    if roles is not None and not principal.roles.intersection(roles):
        raise ToolForbidden(f"tool {call.tool.name!r} needs one of the roles {sorted(roles)}")


def egress_host(url: str) -> str | None:
    """The host to resolve, or ``None`` when the URL is not an acceptable egress URL."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    return host


def is_public(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            ip = mapped
    return ip.is_global and not ip.is_multicast


def decide(principal: Principal, call: PreparedCall, facts: Facts) -> Decision:
    """The whole decision for an authenticated principal; raises the first denial."""
    precheck(principal, call)
    check_owners(
        call.tool,
        principal.tenant,
        principal.sub,
        [facts.owners.get(a) for a, _, _ in call.resources],
    )
    for arg, url in call.egress:
        addresses = facts.addresses.get(arg, ())
        if egress_host(url) is None or not addresses or not all(map(is_public, addresses)):
            raise ToolForbidden(f"argument {arg!r} must be an http(s) URL of a public host")
    impact = impact_of(principal, call)
    return Decision(impact=impact, next=next_step(call.tool, impact))


def check_owners(tool: Tool, tenant: str, user: str, owners: list[Owner | None]) -> None:
    """Every ``x-resource`` must belong to the tenant (and user, for ``owner: user``).

    A missing resource and another tenant's answer the same, so nothing leaks.
    """
    for owner in owners:
        if owner is None or owner.tenant != tenant:
            raise ToolForbidden(NOT_ACCESSIBLE)
        if tool.access.owner == "user" and owner.user != user:
            raise ToolForbidden(NOT_ACCESSIBLE)


def impact_of(principal: Principal, call: PreparedCall) -> Impact:
    tool = call.tool
    if tool.impact != "low" or tool.high_impact_when is None:
        return tool.impact
    try:
        raised = tool.high_impact_when.execute(
            {"args": call.arguments, "principal": principal.as_cel()}
        )
    except Exception:
        return "high"
    return "high" if raised is not False else "low"


def next_step(tool: Tool, impact: Impact) -> Next:
    if impact == "high":
        return "dry_run" if tool.dry_run else "approval"
    return "dry_run" if tool.require_dry_run else "execute"


def may_approve(approver: Principal, actor: str, tenant: str, approvers: list[str]) -> bool:
    """Whether ``approver`` may decide a call of ``actor`` in ``tenant``.

    Same tenant only; ``owner`` lets the actor approve their own call; ``role:<name>`` lets a
    holder of that role approve, but never their own call unless ``owner`` is listed too.
    """
    if approver.tenant != tenant:
        return False
    if approver.sub == actor:
        return "owner" in approvers
    return any(
        entry.startswith("role:") and entry[len("role:") :] in approver.roles for entry in approvers
    )
