"""Trimming what a provider returns before it reaches the model (catalog ``result``)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from app.calls.answers import Execution
from app.calls.states import Finished, Outcome
from app.catalog.models import Tool
from app.evidence import EndorsementItem

REDACTED = "[redacted]"


Plan = dict[str, "Plan | None"]
"""Which members to keep, per level: ``None`` keeps the member whole."""


def minimize(body: Any, fields: Sequence[str] | None, redact: Iterable[str]) -> Any:
    """Keep only ``fields`` (dotted paths; ``None`` keeps all), then mask ``redact`` paths.

    Lists are walked element-wise, so ``items.id`` keeps ``id`` of every item.
    """
    kept = copy.deepcopy(body) if fields is None else _keep(body, _plan(tuple(fields)))
    for dotted in redact:
        _mask(kept, dotted.split("."))
    return kept


@lru_cache(maxsize=1024)
def _plan(fields: tuple[str, ...]) -> Plan:
    """The dotted paths as a tree, made once per catalog's list of fields."""
    return _plan_of([f.split(".") for f in fields])


def _plan_of(paths: list[list[str]]) -> Plan:
    plan: Plan = {}
    for head in dict.fromkeys(p[0] for p in paths):
        rests = [p[1:] for p in paths if p[0] == head]
        plan[head] = None if any(not rest for rest in rests) else _plan_of(rests)
    return plan


def _keep(node: Any, plan: Plan) -> Any:
    if isinstance(node, list):
        return [_keep(item, plan) for item in node]
    if not isinstance(node, dict):
        return None
    result: dict[str, Any] = {}
    for head, rest in plan.items():
        if head in node:
            result[head] = _copy(node[head]) if rest is None else _keep(node[head], rest)
    return result


def _copy(value: Any) -> Any:
    """A kept value, never shared with the provider's body (masking writes in place)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return copy.deepcopy(value)


def _mask(node: Any, path: list[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _mask(item, path)
    elif isinstance(node, dict) and path[0] in node:
        if len(path) == 1:
            node[path[0]] = REDACTED
        else:
            _mask(node[path[0]], path[1:])


def mask_arguments(arguments: Any, sensitive: Iterable[str]) -> Any:
    """Arguments as the audit trail and listings show them: sensitive values masked."""
    if not isinstance(arguments, dict):
        return arguments
    hidden = set(sensitive)
    return {k: REDACTED if k in hidden else v for k, v in arguments.items()}


def sensitive_values(arguments: Any, sensitive: Iterable[str]) -> dict[str, Any]:
    """The sensitive values ``mask_arguments`` hides, for an approver who must judge them."""
    if not isinstance(arguments, dict):
        return {}
    return {k: arguments[k] for k in sorted(set(sensitive)) if k in arguments}


def classify(provider_status: int) -> Outcome:
    """``succeeded`` (2xx), ``failed`` (4xx, the provider refused) or ``unknown`` (anything
    else: a 5xx or a redirect says nothing certain about what happened)."""
    if 200 <= provider_status < 300:
        return "succeeded"
    if 400 <= provider_status < 500:
        return "failed"
    return "unknown"


def trimmed(tool: Tool, provider_status: int, provider_body: Any) -> Any:
    """What of the provider's answer reaches the caller: ``result.fields`` of a 2xx answer,
    ``result.error_fields`` of any other when the catalog names them (a refusal's message,
    which a model needs to correct its call), else ``fields`` too: an error answer shows
    nothing the catalog did not choose to show. ``redact`` masks both."""
    fields = tool.result.fields
    if tool.result.error_fields is not None and not 200 <= provider_status < 300:
        fields = tool.result.error_fields
    return minimize(provider_body, fields, tool.result.redact)


def result_body(
    call_id: str,
    operation_id: str | None,
    status: Finished,
    provider_status: int,
    result: Any,
    endorsement: list[EndorsementItem] | None = None,
) -> Execution:
    """An execution's answer, with the provider's answer as ``trimmed`` leaves it;
    ``endorsement`` (for a tool with ``x-endorsed`` arguments): what endorsed them, as the
    decision found it."""
    body: Execution = {
        "call_id": call_id,
        "operation_id": operation_id,
        "status": status,
        "provider_status": provider_status,
        "result": result,
        "trust": "untrusted",
        "replayed": False,
    }
    if endorsement:
        body["endorsement"] = endorsement
    return body
