"""Validate a catalog completely and compile it, or list every problem with its place.

Everything ``toolgate check`` refuses (docs/catalog.md) is refused here, so ``serve`` and
``check`` share one definition of "valid".
"""

from __future__ import annotations

import ast
import binascii
import difflib
import re
from base64 import b64decode
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

import cel
import jsonschema_rs
import pydantic

from app.canonical import digest
from app.catalog.models import (
    ACTOR,
    Catalog,
    Endorsed,
    EndorsedMode,
    Endpoint,
    Impact,
    OnTaint,
    OnUnendorsed,
    Provider,
    Resource,
    Tool,
    Webhook,
)
from app.catalog.source import Problem, Source, interpolate, read
from app.catalog.spec import (
    TOOL_NAME,
    ApprovalSpec,
    CatalogSpec,
    EndpointSpec,
    NotifySpec,
    ProviderSpec,
    ResourceSpec,
    ToolSpec,
    keys_at,
)
from app.catalog.trusted import WHOLE, FieldPath, parsed, refusal
from app.runs.provenance import declared_names

ANNOTATIONS = {
    "x-identity",
    "x-resource",
    "x-egress",
    "x-sensitive",
    "x-endorsed",
    "x-endorsed-kind",
}
_KIND = re.compile(r"[a-z][a-z0-9_.-]{0,99}")
CEL_VARIABLES = {"args", "principal"}
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_TOOL_NAME = re.compile(TOOL_NAME)
# A path segment as RFC 3986 writes it: unreserved, sub-delims, ':' '@', percent-escapes.
_SEGMENT = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*")
# Types whose values have one exact text to look up by.
_RESOURCE_ID_TYPES = ("string", "integer")
# Variables that CEL macros bind, as in ``principal.roles.exists(r, r == "x")``.
_MACRO_VARIABLE = re.compile(
    r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,"
)
# What CEL selects from `args` and `principal` by a literal name (`args.x`, `args["x"]`);
# string literals are matched as a whole, so a name inside one is not a selection.
_CEL_STRING = (
    r"""[rRbB]{0,2}(?:"{3}[\s\S]*?"{3}|'{3}[\s\S]*?'{3}"""
    r"""|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')"""
)
_CEL_SELECTION = re.compile(
    rf"(?<![\w.])(?P<variable>args|principal)\s*"
    rf"(?:\.\s*(?P<field>[A-Za-z_]\w*)|\[\s*(?P<index>{_CEL_STRING})\s*\])"
    rf"|{_CEL_STRING}"
)
PRINCIPAL_FIELDS = frozenset({"sub", "tenant", "roles"})
"""What ``principal`` holds in CEL (``Principal.as_cel``)."""


class CatalogError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def load(location: Path, env: Mapping[str, str]) -> Catalog:
    """Load and compile the catalog at ``location``; raise ``CatalogError`` listing problems."""
    source = read(location)
    if source.problems:
        raise CatalogError(source.problems)
    catalog = _compile(_shape(source), source, env)
    if source.problems:
        raise CatalogError(source.problems)
    assert catalog is not None
    return catalog


_SECTION_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "providers": ProviderSpec,
    "resources": ResourceSpec,
    "tools": ToolSpec,
}


def _shape(source: Source) -> CatalogSpec:
    """Check each entry's shape on its own, so one bad tool does not hide the others."""
    document = source.document
    top = {k: v for k, v in document.items() if k not in _SECTION_MODELS}
    try:
        spec = CatalogSpec.model_validate(top)
    except pydantic.ValidationError as exc:
        for error in exc.errors():
            source.problem(tuple(error["loc"]), _message(CatalogSpec, error))
        spec = CatalogSpec.model_construct(version="-")
    sections: dict[str, dict[str, Any]] = {}
    for section, model in _SECTION_MODELS.items():
        sections[section] = {}
        for name, entry in document.get(section, {}).items():
            try:
                sections[section][name] = model.model_validate(entry)
            except pydantic.ValidationError as exc:
                for error in exc.errors():
                    source.problem((section, name, *error["loc"]), _message(model, error))
    return spec.model_copy(update=sections)


def _message(model: type[pydantic.BaseModel], error: Mapping[str, Any]) -> str:
    """Pydantic's message, but a key the model does not allow is named with the nearest one
    it does at that place: a newcomer's misspelt key is the common case, and "Extra inputs
    are not permitted" says neither that the key is unknown nor what was meant."""
    if error["type"] != "extra_forbidden" or not error["loc"]:
        return str(error["msg"])
    *parent, key = error["loc"]
    allowed = keys_at(model, tuple(parent))
    nearest = difflib.get_close_matches(str(key), allowed, n=1)
    if nearest:
        return f"unknown key: did you mean {nearest[0]}?"
    if allowed:
        return f"unknown key: allowed here are {', '.join(allowed)}"
    return "unknown key"


def _compile(spec: CatalogSpec, source: Source, env: Mapping[str, str]) -> Catalog | None:
    providers: dict[str, Provider] = {}
    for name, p in spec.providers.items():
        try:
            base_url = interpolate(p.base_url, env).rstrip("/")
            headers = {k: interpolate(v, env) for k, v in p.headers.items()}
        except KeyError as missing:
            source.problem(("providers", name), f"environment variable {missing} is not set")
            continue
        for header, value in headers.items():
            if not _HEADER_NAME.fullmatch(header) or _NOT_IN_A_HEADER.search(value):
                # Named, never quoted: the value is often a secret from the environment.
                source.problem(
                    ("providers", name, "headers", header),
                    "a header name must be an HTTP token, and its value free of control "
                    "characters (a line break, often at the end of a secret read from a file)",
                )
        url = _http_url(base_url)
        if url is None or url.query or url.fragment:
            source.problem(("providers", name, "base_url"), "must be an http(s) URL with a host")
            continue
        if not base_url.isascii() or not all(map(_is_segment, url.path.split("/")[1:])):
            source.problem(
                ("providers", name, "base_url"),
                "must be written percent-encoded, with no '.' or '..' path segments",
            )
            continue
        providers[name] = Provider(name, base_url, p.timeout_s, headers, p.max_response_bytes)
    resources: dict[str, Resource] = {}
    for name, r in spec.resources.items():
        where = ("resources", name)
        endpoint = _endpoint(r.owner, {"id"}, (*where, "owner"), source)
        if r.provider not in source.document.get("providers", {}):
            source.problem((*where, "provider"), f"unknown provider {r.provider!r}")
        elif r.provider in providers:
            resources[name] = Resource(name, providers[r.provider], endpoint)
    tools = {}
    for name, t in spec.tools.items():
        tool = _tool(name, t, providers, resources, spec, source)
        if tool is not None:
            tools[name] = tool
    webhooks: dict[str, Webhook] = {}
    for i, n in enumerate(spec.notify):
        webhook = _webhook(n, ("notify", i), env, source)
        if webhook is not None and webhooks.setdefault(webhook.url, webhook) is not webhook:
            # Deliveries are queued by URL and signed with the first entry naming it.
            source.problem(
                ("notify", i, "url"), "names a URL of an earlier entry: list its events there"
            )
    if source.problems:
        return None
    return Catalog(
        label=spec.version,
        policy_version=f"{spec.version}#{digest(source.document)[7:13]}",
        tools=tools,
        webhooks=tuple(webhooks.values()),
        warnings=tuple(map(str, source.warnings)),
    )


def _approval(
    spec: ApprovalSpec | None,
    where: tuple[str | int, ...],
    impact: Impact,
    program: cel.Program | None,
    source: Source,
) -> ApprovalSpec | None:
    """The approval section with its approvers as the rules read them: ``actor`` for the
    call's own actor (``owner``, its former name, still accepted with a warning: it read as
    the record's owner of ``access.owner``), ``role:<name>`` for a role's holders. Warns when
    a tool that is high impact by its own rule lets its actor approve the call alone."""
    if spec is None:
        return None
    approvers = []
    for i, approver in enumerate(spec.approvers):
        if approver == "owner":
            source.warning(
                (*where, "approvers", i),
                "'owner' here means the call's actor: write 'actor' ('owner' is accepted for now)",
            )
            approver = ACTOR
        elif approver != ACTOR and not re.fullmatch(r"role:[^\s:]+", approver):
            source.problem((*where, "approvers", i), "approvers are 'actor' or 'role:<name>'")
        approvers.append(approver)
    if ACTOR in approvers and spec.quorum > 1:
        source.problem(
            (*where, "quorum"),
            "a quorum is of people other than the call's actor: list only roles in approvers",
        )
    elif ACTOR in approvers and (impact == "high" or program is not None):
        source.warning(
            (*where, "approvers"),
            "the actor may approve their own high-impact call: list only roles to need a"
            " second person",
        )
    return spec.model_copy(update={"approvers": approvers})


def _webhook(
    n: NotifySpec, where: tuple[str | int, ...], env: Mapping[str, str], source: Source
) -> Webhook | None:
    """A webhook whose URL and secret are usable now: a missing secret fails the load, not
    every later delivery."""
    try:
        url = interpolate(n.url, env)
    except KeyError as missing:
        source.problem((*where, "url"), f"environment variable {missing} is not set")
        return None
    parts = _http_url(url)
    if parts is None or parts.fragment:
        source.problem((*where, "url"), "must be an http(s) URL with a host")
        return None
    if not url.isascii() or not url.isprintable() or " " in url or "\\" in url:
        source.problem((*where, "url"), "must be written percent-encoded")
        return None
    secret = env.get(n.secret_env)
    if secret is None:
        source.problem((*where, "secret_env"), f"environment variable {n.secret_env} is not set")
        return None
    try:
        key = b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not secret.startswith("whsec_") or len(key) < 24:
        source.problem(
            (*where, "secret_env"),
            f"{n.secret_env} must hold whsec_ and at least 24 base64-encoded random bytes",
        )
        return None
    return Webhook(url=url, events=frozenset(n.events), secret=secret)


def _tool(
    name: str,
    t: ToolSpec,
    providers: Mapping[str, Provider],
    resources: Mapping[str, Resource],
    spec: CatalogSpec,
    source: Source,
) -> Tool | None:
    where = ("tools", name)
    before = len(source.problems)
    if not _TOOL_NAME.fullmatch(name):
        source.problem(where, "a tool name is 1-64 letters, digits, '_' or '-'")
    if t.provider not in source.document.get("providers", {}):
        source.problem((*where, "provider"), f"unknown provider {t.provider!r}")
    required = set(t.parameters.get("required", [])) if isinstance(t.parameters, dict) else set()
    validator = _schema(t.parameters, (*where, "parameters"), source)
    annotations = _annotations(t.parameters, (*where, "parameters"), spec, source)
    if t.execute is None:
        source.problem(where, "a tool needs an execute endpoint")
    endpoints = {
        "execute": (t.execute, required),
        "dry_run": (t.dry_run, required),
        "reconcile": (t.reconcile, {"operation_id"}),
    }
    compiled = {
        key: _endpoint(e, allowed, (*where, key), source) if e else None
        for key, (e, allowed) in endpoints.items()
    }
    if t.require_dry_run and t.dry_run is None:
        source.problem((*where, "require_dry_run"), "require_dry_run needs a dry_run endpoint")
    program = _cel(
        t.high_impact_when, _top_level(t.parameters), (*where, "high_impact_when"), source
    )
    endorsed = annotations[4] if annotations else ()
    on_unendorsed: OnUnendorsed = t.on_unendorsed or ("approve" if t.approval else "deny")
    if "on_unendorsed" in t.model_fields_set and not endorsed:
        source.problem((*where, "on_unendorsed"), "on_unendorsed needs an x-endorsed argument")
    if t.approval is None and endorsed and on_unendorsed == "approve":
        source.problem(
            (*where, "on_unendorsed"), "on_unendorsed: approve needs an approval section"
        )
    if t.mutation:
        impact: Impact = t.impact or "low"
        on_taint: OnTaint = t.on_taint or ("approve" if t.approval else "deny")
        if t.approval is None and (impact == "high" or program is not None):
            source.problem(
                (*where, "approval"), "a tool that can be high impact needs an approval section"
            )
        elif t.approval is None and on_taint == "approve":
            source.problem((*where, "on_taint"), "on_taint: approve needs an approval section")
    else:
        impact, on_taint = "read", t.on_taint or "allow"
        for key in ("impact", "high_impact_when", "reconcile", "require_dry_run"):
            if key in t.model_fields_set:
                source.problem((*where, key), f"{key} only applies to mutations")
        if t.approval is not None and not (endorsed and on_unendorsed == "approve"):
            source.problem(
                (*where, "approval"),
                "a read is approved only when its unendorsed arguments are"
                " (x-endorsed arguments, on_unendorsed: approve)",
            )
        if on_taint == "approve":
            source.problem((*where, "on_taint"), "a read cannot be approved: deny or allow")
    recheck = t.approval.recheck if t.approval else None
    if recheck and t.dry_run is None:
        source.problem((*where, "approval", "recheck"), "recheck needs a dry_run endpoint")
    approval = _approval(t.approval, (*where, "approval"), impact, program, source)
    for i, shown in enumerate(t.approval.summary if t.approval else []):
        if shown not in _top_level(t.parameters):
            source.problem(
                (*where, "approval", "summary", i), f"{shown!r} is not a top-level parameter"
            )
        elif annotations is not None and shown in annotations[3]:
            source.problem(
                (*where, "approval", "summary", i),
                f"{shown!r} is x-sensitive: the inbox never shows its value",
            )
    for key, paths in (
        ("fields", t.result.fields or []),
        ("error_fields", t.result.error_fields or []),
        ("redact", t.result.redact),
    ):
        for i, dotted in enumerate(paths):
            if not all(dotted.split(".")):
                source.problem((*where, "result", key, i), f"bad dotted path {dotted!r}")
    trusted = _trusted(t, (*where, "result", "trusted"), source)
    if len(source.problems) > before or validator is None or annotations is None:
        return None
    if t.provider not in providers or any(kind not in resources for _, kind in annotations[1]):
        return None  # already reported where the provider or resource is defined
    identity, resource_names, egress, sensitive, endorsed = annotations
    execute = compiled["execute"]
    assert execute is not None
    resource_args = tuple((arg, resources[kind]) for arg, kind in resource_names)
    path_args = {p for e in (execute, compiled["dry_run"]) if e for p in e.placeholders}
    path_args.update(arg for arg, r in resource_args if r.owner.placeholders)
    return Tool(
        name=name,
        title=t.title or name.replace("_", " ").strip().capitalize() or name,
        description=t.description,
        mutation=t.mutation,
        provider=providers[t.provider],
        execute=execute,
        dry_run=compiled["dry_run"],
        reconcile=compiled["reconcile"],
        require_dry_run=t.require_dry_run,
        impact=impact,
        high_impact_when=program,
        approval=approval,
        recheck=recheck is not False and t.dry_run is not None,
        on_taint=on_taint,
        endorsed_args=tuple(
            Endorsed(arg, mode, kind or f"{name}.{arg}", many) for arg, mode, kind, many in endorsed
        ),
        on_unendorsed=on_unendorsed,
        access=t.access,
        cost=t.cost,
        parameters=t.parameters,
        public_parameters=_model_facing(t.parameters, identity),
        validator=validator,
        identity_args=identity,
        resource_args=resource_args,
        egress_args=egress,
        path_args=frozenset(path_args),
        sensitive_args=sensitive,
        declared_keys=declared_names(t.parameters),
        result=t.result,
        trusted=trusted,
    )


def _trusted(t: ToolSpec, where: tuple[str | int, ...], source: Source) -> tuple[FieldPath, ...]:
    """``result.trusted`` compiled (``app.catalog.trusted``): a read's field paths that its
    result can hold. A mutation's result is never trusted: a write vouches for nothing, and
    what it answers is mostly what the model sent."""
    written = t.result.trusted
    if written is False:
        return ()
    if t.mutation:
        source.problem(where, "a write vouches for nothing: only a read's result is trusted")
        return ()
    if written is True:
        return WHOLE
    if not written:
        source.problem(where, "trusted is true or a non-empty list of field paths")
    paths = []
    for i, dotted in enumerate(written):
        path = parsed(dotted)
        if path is None:
            source.problem(
                (*where, i),
                f"bad field path {dotted!r}: keys joined by '.', each key followed by '[]'"
                " for every item of a list there ('messages[].sender'; '[].email' when the"
                " result is a list)",
            )
        elif reason := refusal(path, t.result.fields, t.result.redact):
            source.problem((*where, i), f"{dotted!r} {reason}")
        else:
            paths.append(path)
    return tuple(paths)


def _endpoint(
    e: EndpointSpec, allowed: set[str], where: tuple[str | int, ...], source: Source
) -> Endpoint:
    names = tuple(_PLACEHOLDER.findall(e.path))
    for segment in e.path.split("/")[1:]:
        if not (_PLACEHOLDER.fullmatch(segment) or _is_segment(segment)):
            source.problem(
                (*where, "path"),
                f"segment {segment!r}: a placeholder must be a whole segment, and the rest "
                "written percent-encoded, with no '.' or '..' segments",
            )
    for placeholder in names:
        if placeholder not in allowed:
            source.problem(
                (*where, "path"),
                f"placeholder {{{placeholder}}} has no matching required argument",
            )
    return Endpoint(method=e.method, path=e.path, placeholders=names)


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NOT_IN_A_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""RFC 9110's field name and the control characters a field value cannot hold (a tab it
can). The HTTP client refuses such a header only when sending, that is on every call to the
provider, after a mutation has claimed its key; the catalog is refused at load instead."""

_HOST = re.compile(r"[A-Za-z0-9._~-]+|[0-9A-Fa-f:.]+")
"""A host name, IPv4 address or (its brackets taken off) IPv6 address; no other library
would read a space or a backslash in a host as this parser does."""


def _http_url(url: str) -> SplitResult | None:
    """``url``'s parts when it is an http(s) URL with a host and a usable port, else
    ``None``: a URL that cannot be parsed (``http://[::1``) or whose port is out of range
    is a problem of the catalog, not a crash of the load or a request that fails each time."""
    try:
        parts = urlsplit(url)
        if parts.port == 0:
            return None
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not _HOST.fullmatch(parts.hostname or ""):
        return None
    return parts


def _is_segment(segment: str) -> bool:
    """Whether ``segment`` can be sent exactly as written: requests go out verbatim, never
    re-encoded or normalized, so a path is the shape the catalog declares."""
    return segment not in (".", "..") and _SEGMENT.fullmatch(segment) is not None


DIALECT = "https://json-schema.org/draft/2020-12/schema"
"""The one ``$schema`` a tool's parameters may name; the validator knows it without a fetch."""


def _schema(
    schema: dict[str, Any], where: tuple[str | int, ...], source: Source
) -> jsonschema_rs.Draft202012Validator | None:
    if schema.get("type") != "object":
        source.problem(where, "parameters must be a JSON Schema with type: object")
        return None
    if schema.get("$schema", DIALECT) not in (DIALECT, DIALECT + "#"):
        source.problem((*where, "$schema"), f"only JSON Schema 2020-12 ({DIALECT}) is supported")
        return None
    try:
        jsonschema_rs.meta.validate(schema)
        # Offline: a $ref must resolve inside the catalog. One that names a URL or a file
        # would make what a tool accepts depend on a document the policy version does not
        # cover, fetched (from wherever the catalog says) at every load.
        return jsonschema_rs.Draft202012Validator(schema, validate_formats=True, offline=True)
    except jsonschema_rs.ValidationError as exc:
        source.problem((*where, *exc.instance_path), f"invalid JSON Schema: {exc.message}")
    except (jsonschema_rs.ReferencingError, ValueError) as exc:
        source.problem(where, f"invalid JSON Schema: {str(exc).splitlines()[0]}")
    return None


Annotations = tuple[
    dict[str, Any],
    list[tuple[str, str]],
    tuple[str, ...],
    frozenset[str],
    tuple[tuple[str, EndorsedMode, str | None, bool], ...],
]


def _annotations(
    schema: dict[str, Any], where: tuple[str | int, ...], spec: CatalogSpec, source: Source
) -> Annotations | None:
    """Collect the ``x-`` annotations; they are honoured on top-level properties only."""
    before = len(source.problems)
    properties = schema.get("properties", {})
    for path, key in _annotation_keys(schema, ()):
        if len(path) != 2 or path[0] != "properties" or key not in ANNOTATIONS:
            source.problem(
                (*where, *path, key),
                "unknown annotation"
                if key not in ANNOTATIONS
                else "annotations are only honoured on top-level properties",
            )
    identity: dict[str, Any] = {}
    resource_names: list[tuple[str, str]] = []
    egress: list[str] = []
    sensitive: set[str] = set()
    endorsed: list[tuple[str, EndorsedMode, str | None, bool]] = []
    for arg, prop in properties.items() if isinstance(properties, dict) else ():
        if not isinstance(prop, dict):
            continue
        here = (*where, "properties", arg)
        if "x-identity" in prop:
            if prop["x-identity"] not in ("user", "tenant"):
                source.problem((*here, "x-identity"), "x-identity is 'user' or 'tenant'")
            identity[arg] = prop["x-identity"]
        if "x-resource" in prop:
            if prop["x-resource"] not in source.document.get("resources", {}):
                source.problem((*here, "x-resource"), f"unknown resource {prop['x-resource']!r}")
            elif prop.get("type") not in _RESOURCE_ID_TYPES:
                source.problem(
                    (*here, "x-resource"),
                    "an x-resource property needs type: string or type: integer, so every "
                    "value has one id to look up",
                )
            resource_names.append((arg, prop["x-resource"]))
        if "x-egress" in prop:
            if prop["x-egress"] != "public":
                source.problem((*here, "x-egress"), "x-egress supports only 'public'")
            elif prop.get("type") != "string":
                source.problem((*here, "x-egress"), "an x-egress property needs type: string")
            egress.append(arg)
        if "x-sensitive" in prop:
            if not isinstance(prop["x-sensitive"], bool):
                source.problem((*here, "x-sensitive"), "x-sensitive is true or false")
            elif prop["x-sensitive"] and "x-resource" in prop:
                # A resource id is the call's target, or may become it: stored, audited and
                # listed as such, unmasked, so the promise to mask it could not be kept.
                source.problem(
                    (*here, "x-sensitive"),
                    "a resource id is shown as the call's target in the audit trail and "
                    "listings: an x-resource property cannot be x-sensitive",
                )
            elif prop["x-sensitive"]:
                sensitive.add(arg)
        endorsement = _endorsement(arg, prop, here, source)
        if endorsement is not None:
            endorsed.append(endorsement)
    if len(source.problems) > before:
        return None
    return identity, resource_names, tuple(egress), frozenset(sensitive), tuple(endorsed)


def _endorsement(
    arg: str, prop: dict[str, Any], here: tuple[str | int, ...], source: Source
) -> tuple[str, EndorsedMode, str | None, bool] | None:
    """An ``x-endorsed`` property's mode, kind and whether it is a list, or ``None`` (not
    endorsed, or refused: an annotation toolgate cannot honour refuses the catalog)."""
    marked, kind = prop.get("x-endorsed", False), prop.get("x-endorsed-kind")
    if kind is not None and (not isinstance(kind, str) or not _KIND.fullmatch(kind)):
        source.problem(
            (*here, "x-endorsed-kind"),
            "x-endorsed-kind is 1-100 of lowercase letters, digits, '_', '.' and '-'",
        )
    if marked is False:
        if "x-endorsed-kind" in prop:
            source.problem((*here, "x-endorsed-kind"), "x-endorsed-kind needs x-endorsed")
        return None
    if marked not in (True, "links"):
        source.problem((*here, "x-endorsed"), "x-endorsed is true or 'links'")
        return None
    if "x-identity" in prop:
        source.problem(
            (*here, "x-endorsed"),
            "an x-identity argument is always the session's own: it needs no endorsement",
        )
    allowed = ("string",) if marked == "links" else ("string", "integer")
    typed, many = _one_type(prop), False
    if typed is not None and typed[0] == "array":  # each item judged: prefixItems left out
        many = True
        typed = None if "prefixItems" in typed[1] else _one_type(typed[1].get("items"))
    if typed is None or typed[0] not in allowed:
        needs = "links needs type: string" if marked == "links" else "needs type: string or integer"
        source.problem(
            (*here, "x-endorsed"),
            f"x-endorsed{':' if marked == 'links' else ''} {needs}, which may be nullable"
            ' (type: [string, "null"], or anyOf: [{type: string}, {type: "null"}]), or an array'
            " of such items",
        )
        return None
    return arg, "links" if marked == "links" else "value", kind, many


def _one_type(schema: Any) -> tuple[str, dict[str, Any]] | None:
    """The one type other than null that every value of ``schema`` has, with the schema
    that says so: ``type: T``, ``type: [T, "null"]``, or ``anyOf`` (or ``oneOf``) of one
    such schema and ``{type: "null"}``; ``None`` when values may be of several types or
    the schema does not say."""
    if not isinstance(schema, dict):
        return None
    if "type" in schema:
        declared = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        others = [name for name in declared if name != "null"]
        return (others[0], schema) if len(others) == 1 and isinstance(others[0], str) else None
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            typed = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
            return _one_type(typed[0]) if len(typed) == 1 else None
    return None


_NAME_MAPS = {"properties", "patternProperties", "$defs", "dependentSchemas"}
_VALUES = {"default", "enum", "const", "examples"}


def _annotation_keys(
    node: Any, path: tuple[str | int, ...], names: bool = False
) -> list[tuple[tuple[str | int, ...], str]]:
    """Every ``x-`` keyword in a schema, skipping property names and literal values."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if not names and isinstance(key, str) and key.startswith("x-"):
                found.append((path, key))
            elif names or key not in _VALUES:
                found.extend(_annotation_keys(value, (*path, key), not names and key in _NAME_MAPS))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found.extend(_annotation_keys(item, (*path, i)))
    return found


def _model_facing(parameters: dict[str, Any], identity: Mapping[str, Any]) -> dict[str, Any]:
    """The schema without its ``x-identity`` arguments (a model shown them guesses them, and
    is refused; toolgate fills them from the token) and without any ``x-`` annotation."""
    schema = dict(parameters)
    if identity:
        schema["properties"] = {
            k: v for k, v in schema.get("properties", {}).items() if k not in identity
        }
        if "required" in schema:
            schema["required"] = [k for k in schema["required"] if k not in identity]
    stripped: dict[str, Any] = _strip_annotations(schema)
    return stripped


def _strip_annotations(node: Any, names: bool = False) -> Any:
    if isinstance(node, dict):
        return {
            k: v
            if not names and k in _VALUES
            else _strip_annotations(v, not names and k in _NAME_MAPS)
            for k, v in node.items()
            if names or not (isinstance(k, str) and k.startswith("x-"))
        }
    if isinstance(node, list):
        return [_strip_annotations(item) for item in node]
    return node


def _cel(
    expression: str | None,
    arguments: frozenset[str],
    where: tuple[str | int, ...],
    source: Source,
) -> cel.Program | None:
    if expression is None:
        return None
    try:
        program = cel.compile(expression)
    except ValueError as exc:
        source.problem(where, f"CEL does not compile: {str(exc).splitlines()[0]}")
        return None
    bound = set(_MACRO_VARIABLE.findall(expression))
    unknown = set(program.variables()) - CEL_VARIABLES - bound
    if unknown:
        source.problem(where, f"CEL may only reference args and principal, not {sorted(unknown)}")
        return None
    known = {("args", name) for name in arguments} | {("principal", f) for f in PRINCIPAL_FIELDS}
    undeclared = sorted(_selected(expression) - known)
    if undeclared:
        named = ", ".join(f"{variable}.{name}" for variable, name in undeclared)
        source.problem(
            where,
            f"CEL names {named}, which a call does not have (args: the top-level properties"
            f" of parameters; principal: {', '.join(sorted(PRINCIPAL_FIELDS))}): a misspelt"
            " name would make every call high impact",
        )
        return None
    return program


def _selected(expression: str) -> set[tuple[str, str]]:
    """The ``(variable, name)`` pairs an expression selects by a literal name."""
    found = set()
    for match in _CEL_SELECTION.finditer(expression):
        if match["field"]:
            found.add((match["variable"], match["field"]))
        elif match["index"]:
            found.add((match["variable"], _cel_string(match["index"])))
    return found


def _cel_string(literal: str) -> str:
    """A CEL string literal's text (its escapes read as Python reads them; one that cannot
    be read is kept as written, which names no argument, so it is refused)."""
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        return literal
    return value if isinstance(value, str) else literal


def _top_level(parameters: Any) -> frozenset[str]:
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return frozenset(properties) if isinstance(properties, dict) else frozenset()
