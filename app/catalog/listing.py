"""Tool definitions as each tool-calling ecosystem expects them (GET /catalog).

Only the tools the principal may use are listed, and ``x-`` annotations never leave.
"""

from __future__ import annotations

from typing import Any, Literal

from app.auth.principal import Principal
from app.catalog.models import Catalog, Tool

Format = Literal["raw", "openai", "anthropic", "mcp"]


def usable(tool: Tool, principal: Principal) -> bool:
    roles = tool.access.roles
    return roles is None or bool(principal.roles.intersection(roles))


def listing(catalog: Catalog, principal: Principal, fmt: Format) -> dict[str, Any]:
    tools = [t for t in catalog.tools.values() if usable(t, principal)]
    shape = _SHAPES[fmt]
    return {"policy_version": catalog.policy_version, "tools": [shape(t) for t in tools]}


def _raw(tool: Tool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "mutation": tool.mutation,
        "impact": tool.impact,
        "dry_run": tool.dry_run is not None,
        "parameters": tool.public_parameters,
    }


def _openai(tool: Tool) -> dict[str, Any]:
    """Chat Completions ``tools`` entries."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.public_parameters,
        },
    }


def _anthropic(tool: Tool) -> dict[str, Any]:
    """Messages API ``tools`` entries."""
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.public_parameters,
    }


def _mcp(tool: Tool) -> dict[str, Any]:
    """MCP ``tools/list`` result entries."""
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.public_parameters,
        "annotations": {
            "readOnlyHint": not tool.mutation,
            "destructiveHint": tool.mutation,
            "idempotentHint": not tool.mutation,
        },
    }


_SHAPES = {"raw": _raw, "openai": _openai, "anthropic": _anthropic, "mcp": _mcp}
