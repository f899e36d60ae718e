"""The authorization decision as pure functions: no I/O, no clock, no database.

The service gathers facts (resource owners, resolved egress addresses) and asks ``decide``;
everything here is a function of (principal, tool, arguments, facts), which is what most
tests exercise.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import rfc8785

from app import evidence, recordable
from app.auth.principal import Principal
from app.calls.states import Next
from app.canonical import SAFE_INTEGER, as_written, digest
from app.catalog.models import Impact, Owner, Resource, Tool, argument_text
from app.errors import (
    IdentitySpoof,
    InvalidArguments,
    OutOfScope,
    TaintedArguments,
    ToolForbidden,
    UnendorsedArguments,
)
from app.runs import endorsement
from app.runs.endorsement import Endorsement, Sources
from app.runs.provenance import Candidate, Recall, Taint, candidates, findings

NOT_ACCESSIBLE = "a resource named in the arguments is not accessible to this session"


class Target(NamedTuple):
    type: str
    id: str

    def as_dict(self) -> evidence.Target:
        return {"type": self.type, "id": self.id}


class PreparedCall(NamedTuple):
    """A call whose arguments passed the schema: normalized, fingerprinted, targeted."""

    tool: Tool
    arguments: dict[str, Any]
    fingerprint: str
    target: Target | None
    resources: tuple[tuple[str, Resource, str], ...]
    """(argument, resource type, id text) for every ``x-resource`` argument present."""
    egress: tuple[tuple[str, Any], ...]
    """(argument, value) for every ``x-egress`` argument present, whatever its type: a
    value that is not an acceptable URL is refused by ``decide``, never skipped."""


class Scope(NamedTuple):
    """A run's scope: the tools it may call, and what a call of another does."""

    tools: frozenset[str]
    outside: Literal["deny", "approve"]


class Facts(NamedTuple):
    """What the service looked up just now for this decision."""

    owners: Mapping[str, Owner | None]
    """Owner per ``x-resource`` argument; ``None`` when missing (or not ours to know)."""
    addresses: Mapping[str, tuple[str, ...]]
    """Resolved addresses per ``x-egress`` argument; empty when resolution failed."""
    recall: Recall | None = None
    sources: Sources | None = None
    """What can endorse the call's ``x-endorsed`` arguments (``None``: the tool has none)."""
    scope: Scope | None = None
    """The scope of the call's run (``None``: outside a run, or a run without one)."""
    """What the call's run remembers of its arguments (``taint_candidates``); ``None``
    outside a run, or when nothing needs judging."""


class Decision(NamedTuple):
    impact: Impact
    next: Next
    taint: tuple[Taint, ...] = ()
    endorsement: tuple[Endorsement, ...] = ()
    """Each ``x-endorsed`` argument present: what endorses it, or why nothing does."""
    outside_scope: bool = False
    """The call is outside its run's scope, and needs an approval for it."""


def fingerprint(tool: str, target: Target | None, arguments: Mapping[str, Any]) -> str:
    document = {
        "tool": tool,
        "target": target.as_dict() if target else None,
        "arguments": arguments,
    }
    return digest(document)


def completed(tool: Tool, principal: Principal, raw: Any) -> Any:
    """The arguments as the model was shown the tool: model-facing schemas leave out
    ``x-identity`` arguments, so one that is absent (or ``null``) is the session's own user or
    tenant, filled in here from the verified token. A value the model did send is kept, and
    checked like any other (``precheck``: another user is ``identity_spoof``)."""
    if not isinstance(raw, dict) or all(raw.get(arg) is not None for arg in tool.identity_args):
        return raw
    filled = dict(raw)
    for arg, kind in tool.identity_args.items():
        if filled.get(arg) is None:
            filled[arg] = principal.sub if kind == "user" else principal.tenant
    return filled


def prepare(tool: Tool, raw: Any) -> PreparedCall:
    """Validate arguments against the tool's schema, filling defaults; raise on any error.
    Arguments that cannot be stored or canonicalized (``recordable``) are refused first.
    Numbers are kept as the fingerprint's canonical JSON writes them (``as_written``), so
    what is validated, judged, approved and sent is exactly what was fingerprinted."""
    if not isinstance(raw, dict):
        raise InvalidArguments(
            "arguments must be a JSON object", errors=[{"path": "", "message": "not an object"}]
        )
    unfit = recordable.problems(raw)
    if unfit:
        raise InvalidArguments("arguments hold values that cannot be recorded", errors=unfit)
    arguments = as_written(_with_defaults(tool.parameters, raw))
    errors = [
        {"path": "/" + "/".join(str(p) for p in e.instance_path), "message": e.message}
        for e in tool.validator.iter_errors(arguments)
    ]
    if errors:
        raise InvalidArguments("arguments do not match the tool's schema", errors=errors)
    resources = _resource_ids(tool, arguments)
    target = Target(resources[0][1].type, resources[0][2]) if resources else None
    try:
        digest = fingerprint(tool.name, target, arguments)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidArguments(
            "arguments cannot be canonicalized", errors=[{"path": "", "message": str(exc)}]
        ) from None
    _check_path_segments(tool, arguments)
    return PreparedCall(
        tool=tool,
        arguments=arguments,
        fingerprint=digest,
        target=target,
        resources=resources,
        egress=tuple((arg, arguments[arg]) for arg in tool.egress_args if arg in arguments),
    )


def _resource_ids(
    tool: Tool, arguments: Mapping[str, Any]
) -> tuple[tuple[str, Resource, str], ...]:
    """The id text of every ``x-resource`` argument present; raises if one has none.

    Every present value is looked up or the call refused, never skipped: an id is a string,
    or an integer named by its decimal text (never a bool, a float or anything else).
    """
    resources = []
    errors = []
    for arg, resource in tool.resource_args:
        if arg not in arguments:
            continue
        value = arguments[arg]
        if isinstance(value, str):
            resources.append((arg, resource, value))
        elif type(value) is int and abs(value) <= SAFE_INTEGER:
            resources.append((arg, resource, str(value)))
        else:
            errors.append(
                {
                    "path": f"/{arg}",
                    "message": "a resource id is a string or an integer (|n| < 2**53)",
                }
            )
    if errors:
        raise InvalidArguments("arguments do not name resources", errors=errors)
    return tuple(resources)


_NOT_IN_A_SEGMENT = re.compile(r"[/\\\x00-\x1f\x7f-\x9f]")


def _check_path_segments(tool: Tool, arguments: Mapping[str, Any]) -> None:
    """A value filling a path placeholder must stay one segment of the path the catalog
    declares: percent-encoding keeps ``/`` inside it, but ``.`` and ``..`` survive encoding
    and are resolved away by clients, proxies and frameworks, and an empty segment, a
    backslash or a control character is read differently by different servers."""
    errors = []
    for arg in tool.path_args:
        if arg not in arguments:
            continue
        text = argument_text(arguments[arg])
        if text in ("", ".", "..") or _NOT_IN_A_SEGMENT.search(text):
            errors.append(
                {
                    "path": f"/{arg}",
                    "message": "a URL path segment must not be empty, '.' or '..', nor contain "
                    "'/', '\\' or control characters",
                }
            )
    if errors:
        raise InvalidArguments("arguments cannot be URL path segments", errors=errors)


def _with_defaults(
    schema: Mapping[str, Any], value: Any, root: Mapping[str, Any] | None = None
) -> Any:
    """``value`` with defaults filled in for absent properties, at every object level (array
    items and ``$defs`` the schema refers to included), as new objects (``value`` is left as
    it is). ``null`` for a property the schema does not require counts as absent: OpenAI's
    strict mode makes every property required, at each of those levels too, and has the model
    send ``null`` for the ones it leaves out."""
    root = schema if root is None else root
    schema = _referenced(schema, root)
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        return [_with_defaults(items, item, root) for item in value]
    if not isinstance(value, dict):
        return value
    filled = dict(value)
    required = schema.get("required", ())
    for name, prop in schema.get("properties", {}).items():
        if not isinstance(prop, dict):
            continue
        if name in filled and filled[name] is None and name not in required:
            del filled[name]
        if name not in filled and "default" in prop:
            filled[name] = copy.deepcopy(prop["default"])
        if name in filled:
            filled[name] = _with_defaults(prop, filled[name], root)
    return filled


def _referenced(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` over the ``$defs`` entry its ``"$ref": "#/$defs/<name>"`` names (what
    ``schema`` writes itself, such as its own ``properties``, comes first); else ``schema``."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found = root.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        if isinstance(found, dict):
            return {**found, **schema}
    return schema


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


_EGRESS_URL = re.compile(r"(https?)://([^/?#]*)(?:[/?#].*)?", re.IGNORECASE | re.DOTALL)
_NOT_IN_A_URL = re.compile(r"[\\\x00-\x20\x7f]")
_IPV6_AUTHORITY = re.compile(r"\[([0-9A-Fa-f:.]+)\](?::([0-9]{1,5}))?")
_HOST_AUTHORITY = re.compile(r"([^:\[\]]+)(?::([0-9]{1,5}))?")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


def egress_host(url: Any) -> str | None:
    """The host to resolve, or ``None`` when ``url`` is not an acceptable egress URL.

    Whoever fetches the URL later parses it with its own parser, so only URLs that every
    parser reads alike are accepted: an absolute ``http``/``https`` URL of ASCII with no
    whitespace, control character or backslash, no userinfo, a valid port, and a host that
    is a DNS name (LDH labels, no trailing dot), a dotted-quad IPv4 address or a bracketed
    IPv6 address. A host that ends in a numeric label but is not a dotted quad (``127.1``,
    ``0x7f.0.0.1``, ``2130706433``, ``010.0.0.1``) is refused: other parsers read it as an
    address this check would not see.
    """
    if not isinstance(url, str) or not url.isascii() or _NOT_IN_A_URL.search(url):
        return None
    match = _EGRESS_URL.fullmatch(url)
    if match is None or "@" in match[2]:
        return None
    authority = match[2]
    if authority.startswith("["):
        bracketed = _IPV6_AUTHORITY.fullmatch(authority)
        if bracketed is None:
            return None
        try:
            host = str(ipaddress.IPv6Address(bracketed[1]))
        except ValueError:
            return None
        port = bracketed[2]
    else:
        plain = _HOST_AUTHORITY.fullmatch(authority)
        if plain is None:
            return None
        host, port = plain[1].lower(), plain[2]
        if not _is_host_name(host):
            return None
    if port is not None and not 0 < int(port) <= 65535:
        return None
    return host


def _is_host_name(host: str) -> bool:
    """A dotted-quad IPv4 address, or a DNS name whose last label is not numeric."""
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            return str(ipaddress.IPv4Address(host)) == host
        except ValueError:
            return False
    return len(host) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in labels)


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_EMBEDDING_96 = (
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (and :: and ::1)
    ipaddress.IPv6Network("::ffff:0:0/96"),  # IPv4-mapped
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated
    _NAT64,
)
_NEVER_PUBLIC_V6 = (
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # local-use NAT64: its embedding is local
    ipaddress.IPv6Network("fec0::/10"),  # site-local
    # registered after the address tables of Python 3.11's ipaddress:
    ipaddress.IPv6Network("3fff::/20"),  # documentation (RFC 9637)
    ipaddress.IPv6Network("5f00::/16"),  # segment routing SIDs (RFC 9602)
)


def is_public(address: str) -> bool:
    """Whether ``address`` is a public unicast address. An IPv6 address that carries an
    IPv4 address (mapped, compatible, translated, NAT64, 6to4, Teredo) reaches that IPv4
    host, so it is judged by it."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in _NEVER_PUBLIC_V6):
            return False
        embedded = _embedded_ipv4(ip)
        if embedded:
            return all(map(_is_public_ip, embedded))
    return _is_public_ip(ip)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    if any(ip in network for network in _EMBEDDING_96):
        return (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF),)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo
    return ()


_NEVER_PUBLIC_V4 = ipaddress.IPv4Network("192.0.0.0/24")
"""IETF protocol assignments: not globally reachable (its two anycast addresses, .9 and .10,
are refused too; no webhook lives there). Python's tables before 3.11.10 and 3.12.4 hold only
192.0.0.0/29 private, so ``is_global`` alone would pass 192.0.0.8 to 192.0.0.255."""


def _is_public_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv4Address) and ip in _NEVER_PUBLIC_V4:
        return False
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
    taint = tainted(call, facts.recall)
    if taint and call.tool.on_taint == "deny":
        raise TaintedArguments(
            "arguments carry values from untrusted results: "
            + ", ".join(dict.fromkeys(t.argument for t in taint)),
            taint=[t.as_dict() for t in taint],
        )
    tool = call.tool
    endorsed = endorsement.judge(tool.endorsed_args, call.arguments, facts.sources)
    unendorsed = [e.argument for e in endorsed if not e.endorsed]
    if unendorsed and tool.on_unendorsed == "deny":
        raise UnendorsedArguments(
            "arguments come from nobody the user trusts: " + ", ".join(unendorsed),
            endorsement=[e.as_dict() for e in endorsed],
        )
    outside = facts.scope is not None and tool.name not in facts.scope.tools
    if outside and (facts.scope is None or facts.scope.outside == "deny" or not tool.approval):
        raise OutOfScope(f"tool {tool.name!r} is outside the run's scope")
    impact = impact_of(principal, call)
    if (taint and tool.on_taint == "approve") or unendorsed or outside:
        impact = "high"  # needs a dry-run (when the tool has one) and an approval
    return Decision(
        impact=impact,
        next=next_step(tool, impact),
        taint=taint,
        endorsement=endorsed,
        outside_scope=outside,
    )


def taint_candidates(call: PreparedCall) -> list[Candidate]:
    """The arguments whose provenance the decision needs, if the tool cares: string arguments
    long enough to judge, except ``x-identity`` ones (always the session's own)."""
    if call.tool.on_taint == "allow":
        return []
    tool = call.tool
    return candidates(call.arguments, tool.identity_args, tool.sensitive_args, tool.declared_keys)


def tainted(call: PreparedCall, recall: Recall | None) -> tuple[Taint, ...]:
    """The call's arguments copied from untrusted results of its run and not from its task
    (``app.runs.provenance``)."""
    if recall is None:
        return ()
    return findings(taint_candidates(call), recall)


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
