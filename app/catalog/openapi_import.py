"""``toolgate catalog import-openapi``: catalog entries drafted from an OpenAPI 3.x document.

Each operation becomes a tool: its name from ``operationId``, its parameters (path, query,
and a JSON body's properties) as one JSON Schema object, ``mutation`` from the method, and
``impact: high`` (with an approval to review) for ``DELETE``. What only a person can know
is left as comments to review: which arguments name a resource (``x-resource``, with the
owner lookup it needs), which name the caller (``x-identity``), which are secret
(``x-sensitive``), and who may call the tool (``access``).

toolgate sends a call's path arguments in the path and the others as the query (``GET``,
``DELETE``) or as one JSON object body (``POST``, ``PUT``, ``PATCH``). An operation that
cannot be called that way is not translated, and the reason is given: a body that is not
a JSON object, query parameters beside a body, a required header or cookie, a placeholder
that is not a whole path segment, a reference to another document.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from app.catalog.spec import TOOL_NAME

METHODS = ("get", "post", "put", "patch", "delete")
_NAME = re.compile(TOOL_NAME)
_WHOLE_SEGMENTS = re.compile(r"(/(\{[^{}/]+\}|[^{}/]*))*")
_IDENTITY = re.compile(r"^(user|owner|customer|account|member)_?(id|name)?$|^username$", re.I)
_SECRET = re.compile(r"password|secret|token|api_?key|ssn|card", re.I)
_DROPPED = ("example", "xml", "externalDocs", "discriminator", "nullable")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


class Unsupported(Exception):
    """What toolgate cannot take from the document, in words its author can act on."""


class Imported(NamedTuple):
    text: str
    """The catalog file: readable YAML, with what to review as comments."""
    tools: list[str]
    skipped: list[str]
    """Each operation not translated, and why."""


def translate(document: Any, provider: str, base_url: str | None) -> Imported:
    """The catalog file for ``document``'s operations, served by ``provider`` at
    ``base_url`` (default: the document's first server). Raises ``Unsupported`` for a
    document toolgate cannot use at all."""
    if not isinstance(document, Mapping) or not str(document.get("openapi", "")).startswith("3."):
        raise Unsupported("not an OpenAPI 3.x document (an 'openapi: 3.x' key is required)")
    if not _NAME.fullmatch(provider):
        raise Unsupported(f"--provider {provider!r}: use letters, digits, '_' and '-'")
    url = base_url or _server(document)
    info = document.get("info") or {}
    lines = [
        f"# Drafted by `toolgate catalog import-openapi` from {_one_line(info.get('title'))}",
        "# (OpenAPI). Review each tool: who may call it (access), which arguments name a",
        "# resource, the caller or a secret (the suggestions below), and what is high impact.",
        f"version: {json.dumps(_version(info))}",
        "providers:",
        f"  {provider}:",
        f"    base_url: {json.dumps(url)}",
        "    timeout_s: 10",
        "tools:",
    ]
    tools: list[str] = []
    skipped: list[str] = []
    for path, method, operation, shared in _operations(document):
        label = f"{method.upper()} {path}"
        try:
            name, entry = _tool(document, provider, path, method, operation, shared)
            if name in tools:
                raise Unsupported(f"a second operation named {name!r}")
        except Unsupported as exc:
            skipped.append(f"{label}: {exc}")
            continue
        tools.append(name)
        lines.extend(entry)
    if not tools:
        raise Unsupported("no operation could be translated:\n  " + "\n  ".join(skipped))
    return Imported("\n".join(lines) + "\n", tools, skipped)


def _one_line(title: Any) -> str:
    """The document's title for a comment: one line, or a newline in it would write catalog
    entries of the document author's choosing after the comment."""
    return " ".join(str(title).split()) if title else "a document"


def _server(document: Mapping[str, Any]) -> str:
    servers = document.get("servers") or []
    url = servers[0].get("url") if servers and isinstance(servers[0], Mapping) else None
    if not isinstance(url, str) or "{" in url or not urlsplit(url).netloc:
        raise Unsupported(
            "the document names no absolute server URL without variables: give --base-url"
        )
    return url.rstrip("/")


def _version(info: Mapping[str, Any]) -> str:
    title = re.sub(r"[^A-Za-z0-9]+", "-", str(info.get("title", "imported"))).strip("-").lower()
    return f"{title or 'imported'}-{info.get('version', '1')}"


def _operations(document: Mapping[str, Any]) -> Iterator[tuple[str, str, Any, list[Any]]]:
    for path, item in (document.get("paths") or {}).items():
        if not isinstance(item, Mapping):
            continue
        for method in METHODS:
            if isinstance(item.get(method), Mapping):
                yield path, method, item[method], list(item.get("parameters") or [])


def _tool(
    document: Mapping[str, Any],
    provider: str,
    path: str,
    method: str,
    operation: Mapping[str, Any],
    shared: list[Any],
) -> tuple[str, list[str]]:
    if not _WHOLE_SEGMENTS.fullmatch(path):
        raise Unsupported("a path placeholder that is not a whole segment")
    name = _tool_name(operation.get("operationId"), method, path)
    properties: dict[str, Any] = {}
    required: list[str] = []
    in_path: set[str] = set()
    in_query = False
    declared = {(p.get("in"), p.get("name")): p for p in map(_resolved(document), shared)}
    for parameter in map(_resolved(document), operation.get("parameters") or []):
        declared[parameter.get("in"), parameter.get("name")] = parameter
    for (where, parameter_name), parameter in declared.items():
        if where in ("header", "cookie"):
            if parameter.get("required"):
                raise Unsupported(
                    f"needs the {where} {parameter_name!r}, which toolgate never sends"
                )
            continue
        if where not in ("path", "query") or not isinstance(parameter_name, str):
            raise Unsupported(f"a parameter toolgate cannot read: {where} {parameter_name!r}")
        properties[parameter_name] = _schema(document, _parameter_schema(parameter))
        if parameter.get("description") and "description" not in properties[parameter_name]:
            properties[parameter_name]["description"] = parameter["description"]
        if where == "path" or parameter.get("required"):
            required.append(parameter_name)
        in_path.update([parameter_name] if where == "path" else [])
        in_query = in_query or where == "query"
    body = operation.get("requestBody")
    if body is not None:
        if method in ("get", "delete"):
            raise Unsupported(
                "a body on GET or DELETE: toolgate sends their arguments as the query"
            )
        if in_query:
            raise Unsupported(
                "query parameters beside a body: toolgate sends all of them as the body"
            )
        for key, value in _body(document, body).items():
            if key in properties:
                raise Unsupported(f"{key!r} is both a parameter and a body property")
            properties[key] = value[0]
            required.extend([key] if value[1] else [])
    return name, _entry(name, provider, path, method, operation, properties, required, in_path)


def _parameter_schema(parameter: Mapping[str, Any]) -> Any:
    """A parameter's schema, or that of its JSON content (toolgate writes a value that is not
    a string as compact JSON)."""
    if "schema" in parameter:
        return parameter["schema"]
    content = parameter.get("content") or {}
    if "application/json" in content and "schema" in (content["application/json"] or {}):
        return content["application/json"]["schema"]
    raise Unsupported(f"parameter {parameter.get('name')!r} has no schema toolgate can read")


def _key(name: str) -> str:
    """``name`` as a YAML key that reads back as that text."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name)
    if plain and name.lower() not in _YAML_WORDS:
        return name
    return json.dumps(name)


def _tool_name(operation_id: Any, method: str, path: str) -> str:
    if isinstance(operation_id, str):
        name = re.sub(r"[^A-Za-z0-9_-]", "_", operation_id)[:64]
    else:
        words = [w for w in re.split(r"[^A-Za-z0-9]+", path) if w]
        name = "_".join([method, *words])[:64]
    if not _NAME.fullmatch(name):
        raise Unsupported("no usable operationId")
    return name


def _body(document: Mapping[str, Any], body: Any) -> dict[str, tuple[Any, bool]]:
    """The properties of a JSON object body, each with whether it is required."""
    body = _resolved(document)(body)
    content = body.get("content") or {}
    media = next((m for m in content if m.split(";")[0].strip() == "application/json"), None)
    if media is None:
        raise Unsupported(f"a body that is not JSON ({', '.join(content) or 'no content'})")
    schema = _schema(document, (content[media] or {}).get("schema") or {})
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        raise Unsupported("a JSON body that is not an object with properties")
    needed = set(schema.get("required") or []) if body.get("required") else set()
    return {k: (v, k in needed) for k, v in schema["properties"].items() if not v.get("readOnly")}


def _resolved(document: Mapping[str, Any]) -> Any:
    def resolve(node: Any) -> Any:
        seen = set()
        while isinstance(node, Mapping) and "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/") or ref in seen:
                raise Unsupported(f"a reference toolgate cannot follow: {ref!r}")
            seen.add(ref)
            node = _pointer(document, ref)
        return node

    return resolve


def _pointer(document: Mapping[str, Any], ref: str) -> Any:
    node: Any = document
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or token not in node:
            raise Unsupported(f"a reference to nothing: {ref!r}")
        node = node[token]
    return node


def _schema(document: Mapping[str, Any], node: Any, depth: int = 0) -> Any:
    """An OpenAPI schema as JSON Schema 2020-12: references inlined (a recursive one is
    refused), ``nullable`` as a ``null`` type, boolean exclusive bounds as numbers, and the
    keys JSON Schema does not have left out."""
    if depth > 32:
        raise Unsupported("a schema nested too deeply, or recursive")
    node = _resolved(document)(node)
    if isinstance(node, list):
        return [_schema(document, item, depth + 1) for item in node]
    if not isinstance(node, Mapping):
        return copy.deepcopy(node)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or key.startswith("x-"):
            continue
        if key in ("properties", "patternProperties", "$defs", "dependentSchemas"):
            out[key] = {k: _schema(document, v, depth + 1) for k, v in value.items()}
        elif key in ("items", "not", "additionalProperties", "allOf", "anyOf", "oneOf"):
            out[key] = _schema(document, value, depth + 1)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            if value and bound in node:
                out[key] = node[bound]
        else:
            out[key] = copy.deepcopy(value)
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if node.get(exclusive) is True:
            out.pop(bound, None)
    if node.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _entry(
    name: str,
    provider: str,
    path: str,
    method: str,
    operation: Mapping[str, Any],
    properties: dict[str, Any],
    required: list[str],
    in_path: set[str],
) -> list[str]:
    mutation = method != "get"
    about = operation.get("summary") or operation.get("description") or name
    lines = [
        f"  {_key(name)}:",
        f"    description: {json.dumps(' '.join(str(about).split()))}",
        f"    mutation: {'true' if mutation else 'false'}",
        f"    provider: {provider}",
        f"    execute: {{method: {method.upper()}, path: {json.dumps(path)}}}",
        "    # access: {roles: [...], owner: tenant}   # review: who may call it",
    ]
    if method == "delete":
        lines += [
            "    impact: high                              # a deletion: approved before it runs",
            "    approval: {approvers: [actor], ttl_s: 300}  # review: who approves",
        ]
    elif mutation:
        lines.append("    impact: low                               # review: high_impact_when?")
    lines += [
        "    parameters:",
        "      type: object",
        "      additionalProperties: false",
        f"      required: {json.dumps(sorted(set(required)))}",
        "      properties:" + ("" if properties else " {}"),
    ]
    for arg, schema in properties.items():
        lines.extend(f"        # {hint}" for hint in _hints(arg, arg in in_path))
        lines.append(f"        {_key(arg)}: {json.dumps(schema)}")
    return lines


def _hints(arg: str, in_path: bool) -> list[str]:
    hints = []
    if in_path and re.search(r"(^|_|[a-z])(id|Id|ID)$", arg):
        hints.append(
            "suggestion: x-resource: <type>, if it names a record whose owner a lookup can"
            " tell (declare the type under resources:)"
        )
    if _IDENTITY.match(arg):
        hints.append("suggestion: x-identity: user, if it names the caller")
    if _SECRET.search(arg):
        hints.append("suggestion: x-sensitive: true")
    return hints
