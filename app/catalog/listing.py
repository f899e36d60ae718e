"""Tool definitions as each tool-calling ecosystem expects them (GET /catalog).

Only the tools the principal may use are listed, with the schema a model is shown
(``Tool.public_parameters``): no ``x-`` annotation, no ``x-identity`` argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from typing_extensions import TypedDict

from app.auth.principal import Principal
from app.catalog.models import Catalog, Tool
from app.errors import InvalidRequest

Format = Literal["raw", "openai", "openai-responses", "anthropic", "mcp"]
STRICT_FORMATS = ("openai", "openai-responses")


class Listing(TypedDict):
    """``GET /catalog``: each tool shaped as ``format`` says (``raw``: toolgate's own view,
    with ``mutation``, ``impact`` and ``dry_run``; the others as each ecosystem expects)."""

    policy_version: str
    tools: list[dict[str, Any]]


def usable(tool: Tool, principal: Principal) -> bool:
    roles = tool.access.roles
    return roles is None or bool(principal.roles.intersection(roles))


def listing(catalog: Catalog, principal: Principal, fmt: Format, strict: bool = False) -> Listing:
    """The principal's tools in ``fmt``; ``strict`` (OpenAI formats only) gives OpenAI
    strict-mode schemas."""
    if strict and fmt not in STRICT_FORMATS:
        raise InvalidRequest(f"strict applies to the formats {', '.join(STRICT_FORMATS)}")
    tools = [t for t in catalog.tools.values() if usable(t, principal)]
    shape = _SHAPES[fmt]
    return {
        "policy_version": catalog.policy_version,
        "tools": [shape(t, strict) for t in tools],
    }


def _raw(tool: Tool, strict: bool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "mutation": tool.mutation,
        "impact": tool.impact,
        "dry_run": tool.dry_run is not None,
        "parameters": tool.public_parameters,
    }


def _openai(tool: Tool, strict: bool) -> dict[str, Any]:
    """Chat Completions ``tools`` entries."""
    function: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": strict_schema(tool.public_parameters) if strict else tool.public_parameters,
    }
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _openai_responses(tool: Tool, strict: bool) -> dict[str, Any]:
    """Responses API ``tools`` entries: flat function tools. ``strict`` is always written,
    since the Responses API (and the Agents SDK) take an absent one as ``true``."""
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": strict_schema(tool.public_parameters) if strict else tool.public_parameters,
        "strict": strict,
    }


def _anthropic(tool: Tool, strict: bool) -> dict[str, Any]:
    """Messages API ``tools`` entries."""
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.public_parameters,
    }


def _mcp(tool: Tool, strict: bool) -> dict[str, Any]:
    """MCP ``tools/list`` result entries. ``destructiveHint`` marks mutations that may be high
    impact (those that can need an approval). ``idempotentHint`` is true for reads only: a
    mutation sent again with the same arguments but a new idempotency key acts again."""
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": tool.public_parameters,
        "annotations": {
            "readOnlyHint": not tool.mutation,
            "destructiveHint": tool.mutation
            and (tool.impact == "high" or tool.high_impact_when is not None),
            "idempotentHint": not tool.mutation,
        },
    }


_SHAPES: dict[str, Callable[[Tool, bool], dict[str, Any]]] = {
    "raw": _raw,
    "openai": _openai,
    "openai-responses": _openai_responses,
    "anthropic": _anthropic,
    "mcp": _mcp,
}

# What OpenAI's strict mode accepts in a schema; everything else is left out of a strict
# schema (toolgate still validates the arguments against the whole catalog schema).
_STRICT_KEYWORDS = {
    "type",
    "description",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$defs",
    "$ref",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
}
_STRICT_FORMATS = {
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
}
_OBJECT_KEYWORDS = ("properties", "required", "additionalProperties")
"""Written anew at every object level of a strict schema."""


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` as OpenAI's strict mode requires: every object lists all its properties as
    required and allows no others; a property the schema did not require accepts ``null``
    (which toolgate reads as absent); keywords strict mode does not know are left out."""
    node: dict[str, Any] = {}
    for written, value in schema.items():
        key = "anyOf" if written == "oneOf" else written  # strict mode knows only anyOf
        if key not in _STRICT_KEYWORDS or key in _OBJECT_KEYWORDS:
            continue
        if key == "format" and value not in _STRICT_FORMATS:
            continue
        if key == "items" and isinstance(value, Mapping):
            node[key] = strict_schema(value)
        elif key == "anyOf" and isinstance(value, list):
            node[key] = [strict_schema(v) for v in value if isinstance(v, Mapping)]
        elif key == "$defs" and isinstance(value, Mapping):
            node[key] = {name: strict_schema(v) for name, v in value.items()}
        else:
            node[key] = value
    properties = schema.get("properties")
    if any(key in schema for key in _OBJECT_KEYWORDS) or schema.get("type") == "object":
        required = set(schema.get("required", ()))
        props = properties if isinstance(properties, Mapping) else {}
        node["properties"] = {
            name: strict_schema(prop) if name in required else _nullable(strict_schema(prop))
            for name, prop in props.items()
        }
        node["required"] = list(props)
        node["additionalProperties"] = False
    return node


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str | list) and "const" not in schema:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        nullable = {**schema, "type": kinds if "null" in kinds else [*kinds, "null"]}
        if "enum" in schema and None not in schema["enum"]:
            nullable["enum"] = [*schema["enum"], None]
        return nullable
    described = {"description": schema["description"]} if "description" in schema else {}
    inner = {k: v for k, v in schema.items() if k != "description"}
    return {**described, "anyOf": [inner, {"type": "null"}]}
