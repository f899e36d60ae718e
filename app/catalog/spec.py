"""The catalog file's shape, as pydantic models that forbid unknown keys.

These models describe only what the YAML may say; cross-references, JSON Schema and CEL
are checked in ``loader`` once the shape is right. They are also the one source of the
catalog's published JSON Schema (``json_schema``, ``toolgate catalog-schema``): each field's
docstring is its description there, which editors show while a catalog is written.
"""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
TOOL_NAME = "^[A-Za-z0-9_-]{1,64}$"
"""A name every tool-calling format accepts: OpenAI's and Anthropic's rule, the narrowest."""


class _Spec(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True
    )


class ProviderSpec(_Spec):
    """A service toolgate forwards calls to."""

    base_url: str = Field(min_length=1)
    """http(s) URL, percent-encoded, that endpoint paths are appended to; may use ${NAME} or
    ${NAME:-default} environment references."""
    timeout_s: float = Field(default=5.0, gt=0, le=300)
    """Seconds a request to this provider may take, connecting included."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Headers sent with every request to this provider; values may use ${NAME} or
    ${NAME:-default} environment references."""
    # The outbound client's own default cap, stated here rather than imported, so that the
    # catalog's models (and the policy that reads them) load no I/O library.
    max_response_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    """The longest answer read from this provider, in bytes; a longer one is not read at
    all."""


class EndpointSpec(_Spec):
    """One HTTP endpoint of a provider."""

    method: Method
    path: str = Field(pattern=r"^/")
    """Appended to the provider's base_url; a {name} placeholder is a whole path segment."""


class ResourceSpec(_Spec):
    """A kind of record whose owner toolgate looks up at every decision."""

    provider: str
    """The provider that answers owner lookups."""
    owner: EndpointSpec
    """Owner lookup, with an {id} placeholder; answers {"tenant": ..., "user": ...}."""


class ApprovalSpec(_Spec):
    """Who may approve a high-impact call, and for how long an approval holds."""

    approvers: list[str] = Field(min_length=1)
    """'actor' (the call's actor may approve their own call; 'owner', its former name, is
    still read so) and/or 'role:<name>'."""
    ttl_s: int = Field(default=300, gt=0, le=86400)
    """Seconds an approval, and a dry-run of this tool, stays valid."""
    recheck: bool | None = None
    """Before an approved call runs, preview it again; if the preview changed since the
    approval, the call does not run (approval_stale). Default: true when the tool has a
    dry_run (which it needs)."""
    quorum: int = Field(default=1, ge=1, le=10)
    """Distinct approvers who must each approve the same preview before the call runs (never
    the call's actor); a rejection by any one of them is final."""
    summary: list[str] = Field(default=[], max_length=8)
    """Arguments whose values the approvers' inbox shows beside each request, so that two
    requests of one tool can be told apart at a glance (``[amount, currency]``); never an
    ``x-sensitive`` one."""


class AccessSpec(_Spec):
    """Who may use a tool."""

    roles: list[str] | None = None
    """Any one of these roles is enough; absent: any authenticated caller."""
    owner: Literal["tenant", "user"] = "tenant"
    """Every x-resource argument must belong to the caller's tenant ('tenant') or to the
    caller's own user ('user')."""


class ResultSpec(_Spec):
    """What of the provider's answer reaches the caller."""

    fields: list[str] | None = None
    """Dotted paths kept from the provider's JSON; absent: everything is kept."""
    error_fields: list[str] | None = None
    """Dotted paths kept, instead of ``fields``, from a provider's error answer (not 2xx),
    such as its message; absent: an error answer is trimmed by ``fields`` like a result.
    ``redact`` applies to both, and an error answer is untrusted even when ``trusted`` is
    true."""
    redact: list[str] = Field(default_factory=list)
    """Dotted paths whose values are replaced by "[redacted]"."""
    trusted: bool | list[str] = False
    """Reads: what of the result only the user or their tenant can write (their contacts,
    saved payees, a message's sender), never what outsiders can write (a message's text):
    true for the whole result, or field paths (``sender``, ``messages[].sender``,
    ``[].email``: ``[]`` is every item of a list). In a run, the values there endorse
    ``x-endorsed`` arguments of later calls."""


class ToolSpec(_Spec):
    """One tool a model may call."""

    title: str | None = Field(default=None, min_length=1)
    """A human-readable name for tool listings (MCP's title); default: the name, humanized."""
    description: str = ""
    """Shown to models in tool listings."""
    mutation: bool
    """false: the tool only reads; true: it may change durable state."""
    provider: str
    execute: EndpointSpec | None = None
    """Where an authorized call is sent (required)."""
    dry_run: EndpointSpec | None = None
    """Previews the effect of a call without performing it."""
    reconcile: EndpointSpec | None = None
    """Mutations: reports what became of an operation, with an {operation_id} placeholder."""
    require_dry_run: bool = False
    """Mutations: execute only after an unexpired dry-run of the same arguments."""
    impact: Literal["low", "high"] | None = None
    """Mutations: 'low' (default) or 'high'; a high-impact call needs an approval."""
    high_impact_when: str | None = None
    """Mutations: CEL over args and principal; true raises a low-impact call to high."""
    approval: ApprovalSpec | None = None
    """Required when the tool can be high impact: a mutation that may be, or any tool whose
    unendorsed arguments are approved (``on_unendorsed: approve``)."""
    on_taint: Literal["approve", "deny", "allow"] | None = None
    """In a run, a string argument copied from an untrusted result the run was given (and
    not written in its task): 'approve' treats the call as high impact (dry-run and
    approval), 'deny' refuses it (tainted_arguments), 'allow' lets it pass. Default: allow
    for reads; for mutations approve, or deny when the tool has no approval section."""
    on_unendorsed: Literal["approve", "deny"] | None = None
    """An ``x-endorsed`` argument whose value comes from nobody the user trusts (not in the
    run's task, not from a trusted result, not a known value): 'approve' treats the call as
    high impact (dry-run and approval), reads too; 'deny' refuses it
    (unendorsed_arguments). Default: approve when the tool has an approval section, else
    deny."""
    access: AccessSpec = Field(default_factory=AccessSpec)
    cost: float = Field(default=0.0, ge=0)
    """Units charged to a run for each executed call."""
    parameters: dict[str, Any]
    """JSON Schema (2020-12) of the arguments, type: object; top-level properties may carry
    x-identity, x-resource, x-egress and x-sensitive."""
    result: ResultSpec = Field(default_factory=ResultSpec)


WebhookEvent = Literal["approval.requested", "approval.decided", "call.executed", "run.ended"]


class NotifySpec(_Spec):
    """An HTTP endpoint told of events as signed webhooks (Standard Webhooks)."""

    url: str = Field(min_length=1)
    """http(s) URL each event is POSTed to; may use ${NAME} or ${NAME:-default} environment
    references. Deliveries go only to URLs the current catalog names."""
    events: list[WebhookEvent] = Field(min_length=1)
    """Which events this endpoint is told of."""
    secret_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The environment variable holding the signing secret, whsec_ and base64."""


class CatalogSpec(_Spec):
    """A toolgate catalog: a file, or one of the *.yaml files of a catalog directory."""

    model_config = ConfigDict(title="toolgate catalog")
    version: str = Field(min_length=1)
    """Required once per catalog: a label; the policy version is this label, '#', and a short
    hash of the content."""
    providers: dict[str, ProviderSpec] = Field(default_factory=dict)
    resources: dict[str, ResourceSpec] = Field(default_factory=dict)
    tools: dict[str, ToolSpec] = Field(
        default_factory=dict, json_schema_extra={"propertyNames": {"pattern": TOOL_NAME}}
    )
    """Tool names are 1-64 letters, digits, '_' or '-'."""
    notify: list[NotifySpec] = Field(default_factory=list)
    """Webhook endpoints; in a catalog directory, at most one file has this list."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of one catalog file. It checks the file's shape (keys, types,
    ranges); what needs the whole catalog (names that must exist, the JSON Schema and CEL
    inside a tool, placeholders) is left to ``toolgate check``. ``version`` is not required:
    of a directory's files, one may carry it for all."""
    schema = CatalogSpec.model_json_schema()
    required = [name for name in schema.pop("required", []) if name != "version"]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        **({"required": required} if required else {}),
    }


def keys_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The keys ``model`` allows in the mapping at ``loc`` (a pydantic error's location,
    without the offending key), as a catalog writes them; none when ``loc`` leads into no
    model (``parameters``, ``headers``). A bad key is then answered with the nearest good one
    (``toolgate check``'s "did you mean"), from the one definition the schema is made of."""
    annotation: Any = model
    for part in (*loc, None):
        origin = get_origin(annotation)
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            annotation = members[0] if len(members) == 1 else None
            origin = get_origin(annotation)
        if part is None:
            break
        if origin in (list, dict):
            annotation = get_args(annotation)[-1]  # ``part`` is the index or the name
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = _field(annotation, part)
            annotation = field.annotation if field else None
        else:
            return []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [field.alias or name for name, field in annotation.model_fields.items()]
    return []


def _field(model: type[BaseModel], key: str | int) -> FieldInfo | None:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None
