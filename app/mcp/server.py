"""The MCP server (the ``mcp`` SDK's low-level ``Server``): ``tools/list`` and ``tools/call``
for the principal the endpoint verified (``router.Caller``), as MCP results.

A tool call's outcome (``calls.Outcome``) becomes: the execution's answer as the result
(``isError`` when the provider refused it), a refusal as an ``isError`` result carrying the
problem document and its ``code``, a call waiting for an approval as a result that is not an
error (nothing failed; clients and inspectors must not report it as one) with
``{"status": "awaiting_approval", "call_id", "approval_url", "message"}``, and a question for
the user as the ``InputRequiredResult`` the client answers and retries with. Results that
carry a provider's data say ``"trust": "untrusted"`` in ``_meta``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS, is_version_at_least
from pydantic import ValidationError

from app.bodies import is_id
from app.catalog.listing import listing
from app.errors import InvalidRequest
from app.mcp import calls
from app.mcp.caller import Caller

log = logging.getLogger("toolgate.mcp")

DECISION_SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "enum": ["approve", "reject"],
            "description": "Run the call as previewed, or refuse it for good.",
        }
    },
    "required": ["decision"],
}
QUESTION_TIMEOUT_S = 600.0
"""How long a handshake client's user may take to answer toolgate's question; then the call
is answered as waiting for approvers, as a dismissed question is."""


async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    caller = Caller.of(ctx.request)
    tools = listing(caller.state.catalog, caller.principal, "mcp")["tools"]
    return types.ListToolsResult(tools=[types.Tool.model_validate(tool) for tool in tools])


async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    caller = Caller.of(ctx.request)
    meta = params.meta or {}
    run_id = meta.get("run_id")
    if run_id is not None and not is_id(run_id):
        # Taken as absent (empty, say), the call would escape the limits of the run its
        # client meant; it is looked up (a standing call) before any body validates it.
        return result(calls.Refused(InvalidRequest("_meta.run_id must be a run id")))
    answer = (params.input_responses or {}).get(calls.APPROVAL)
    ask = calls.Ask(
        principal=caller.principal,
        session=caller.session,
        request_id=ctx.request_id if ctx.request_id is not None else "",
        tool=params.name,
        arguments=params.arguments or {},
        run_id=run_id,
        elicitation=elicitation_modes(
            ctx.session.client_capabilities, ctx.protocol_version, ctx.session.can_send_request
        ),
        console=caller.base_url,
        answer=answer.model_dump(mode="json") if answer is not None else None,
        request_state=params.request_state,
    )
    try:
        outcome = await calls.call_tool(caller.state, ask)
        if isinstance(outcome, calls.Elicit) and ctx.session.can_send_request:
            # Its answer comes in a request of its own, verified as any (a token of the same
            # user: the session is theirs), and acts as this request's principal.
            reply = await asked(ctx, outcome)
            retry = replace(ask, answer=reply, request_state=outcome.request_state)
            outcome = await calls.call_tool(caller.state, retry)
    except Exception:  # as REST's 500: logged here, nothing of it told to the client
        log.exception("MCP tools/call %s failed unexpectedly", params.name)
        raise MCPError(types.INTERNAL_ERROR, "Internal server error") from None
    return result(outcome)


def result(outcome: calls.Outcome) -> types.CallToolResult | types.InputRequiredResult:
    if isinstance(outcome, calls.Done):
        answer = outcome.answer
        return _result(
            answer,
            is_error=answer["status"] != "succeeded",
            meta={"trust": "untrusted", "call_id": answer["call_id"]},
        )
    if isinstance(outcome, calls.Refused):
        return _result(outcome.error.problem(), is_error=True)
    if isinstance(outcome, calls.Awaiting):
        return _result(
            {
                "status": "awaiting_approval",
                "call_id": outcome.call_id,
                "approval_url": outcome.approval_url,
                "message": (
                    "This call waits for an approver's decision at approval_url. Once it is"
                    " approved, call the tool again with the same arguments: it runs once."
                ),
            },
            is_error=False,
        )
    return types.InputRequiredResult(
        input_requests={calls.APPROVAL: question(outcome)},
        request_state=outcome.request_state,
    )


def question(outcome: calls.Elicit) -> types.ElicitRequest:
    params: types.ElicitRequestParams = (
        types.ElicitRequestFormParams(message=outcome.message, requested_schema=DECISION_SCHEMA)
        if outcome.mode == "form"
        else types.ElicitRequestURLParams(
            message=outcome.message, url=outcome.url, elicitation_id=outcome.call_id
        )
    )
    return types.ElicitRequest(params=params)


async def asked(
    ctx: ServerRequestContext[Any, Any], outcome: calls.Elicit
) -> dict[str, Any] | None:
    """The handshake client's answer to ``outcome``'s question, asked in the stream of the
    request (``None`` when it gives none: timed out, refused, malformed or gone)."""
    try:
        answer = await ctx.session.send_request(
            question(outcome),
            types.ElicitResult,
            request_read_timeout_seconds=QUESTION_TIMEOUT_S,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
        )
    except (MCPError, ValidationError) as error:
        log.info("MCP elicitation for call %s got no answer: %s", outcome.call_id, error)
        return None
    return answer.model_dump(mode="json")


def _result(
    structured: Mapping[str, Any], *, is_error: bool, meta: dict[str, Any] | None = None
) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(structured, default=str))],
        structured_content=dict(structured),
        is_error=is_error,
        meta=meta,
    )


def elicitation_modes(
    capabilities: types.ClientCapabilities | None, revision: str, channel: bool
) -> frozenset[calls.Mode]:
    """The elicitation modes the client declared and can be asked in now (an empty
    declaration is form mode, as before URL mode existed): a client of the current revision
    answers in its retry; a handshake client only where its request has a ``channel`` back
    to it (a session), and in URL mode only from the revision that defined it."""
    declared = capabilities.elicitation if capabilities is not None else None
    if declared is None or not (revision in MODERN_PROTOCOL_VERSIONS or channel):
        return frozenset()
    modes: set[calls.Mode] = set()
    if declared.form is not None or declared.url is None:
        modes.add("form")
    if declared.url is not None and is_version_at_least(revision, "2025-11-25"):
        modes.add("url")
    return frozenset(modes)


def no_header_to_check(name: str) -> None:
    """The schema ``Mcp-Param-*`` headers are checked against (``get_tool_input_schema``):
    none. The SDK checks only properties a listed schema marks ``x-mcp-header``, and the
    schemas toolgate lists never carry an ``x-`` keyword (``Tool.public_parameters``);
    without this answer the SDK would run the whole ``tools/list`` handler for every call
    to find that out (measured: a fifth of an MCP read's time)."""


def build() -> Server[Any]:
    return Server(
        "toolgate",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=no_header_to_check,
    )
