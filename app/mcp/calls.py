"""One MCP ``tools/call``, run through toolgate's own use cases: propose, dry-run when the
call needs one, ask for an approval when it needs one, execute. A call of a tool that can
never need an approval or a preview is one ``/execute``, as REST sends it (``_at_once``).

What "the same request" means. toolgate serves MCP statelessly (any instance may answer any
request), so there is no transport session to name a request by. The *session* is the
bearer token's: its ``sid`` claim, or else the token itself. A mutation's idempotency key is
derived from that session, the JSON-RPC request id, the tool and its arguments
(``request_key``): a resend of the request (same id, same tool, same arguments, same
session) finds the execution record of the first and is answered from it; it never acts
again. A request that differs in any of these is a new request.

A call that needs approval is not executed by the request that proposed it. The approval
comes through elicitation (``Ask``: a form where the actor may approve their own call, else
the console's page for the call), or, for a client that cannot elicit, by an approver
anywhere (``Awaiting``); a later identical request by the same actor then finds the call
(``store.standing``) and runs it, once. The retry of an elicitation carries the original
request's key in its ``requestState``, so it and a resend of the original share one
execution record. ``requestState`` comes back from the client and is trusted for nothing:
the call it names must be the actor's own, and every step is decided again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
from pydantic import ValidationError

from app import load, recordable
from app.approvals import service as approvals
from app.approvals.models import ApproveBody
from app.auth.principal import Principal
from app.bodies import Body
from app.calls import history, policy, service, store
from app.calls.answers import Execution
from app.calls.authorization import visible_call
from app.calls.models import CallRow, DryRunBody, ExecuteBody, IdempotencyKey, ProposeBody
from app.calls.mutation import lock_ttl
from app.calls.policy import PreparedCall
from app.calls.services import Services
from app.calls.waiting import MAX_WAIT_S
from app.catalog.models import Tool
from app.consent import rules
from app.deps import malformed
from app.errors import (
    ApprovalRejected,
    ApprovalStale,
    IdempotencyInFlight,
    InvalidRequest,
    ToolgateError,
)

Mode = Literal["form", "url"]
B = TypeVar("B", bound=Body)
APPROVAL = "approval"
"""The key of the one input request toolgate makes, in ``inputRequests``."""


@dataclass(frozen=True)
class Ask:
    """One ``tools/call`` as toolgate takes it from the MCP server."""

    principal: Principal
    session: str
    request_id: str | int
    tool: str
    arguments: dict[str, Any]
    run_id: str | None
    elicitation: frozenset[Mode]
    """How this client can be asked for an approval (none: it cannot be)."""
    console: str
    """The console's base URL, for approval links."""
    answer: dict[str, Any] | None = None
    """The client's response to toolgate's input request, on a retry."""
    request_state: str | None = None


@dataclass(frozen=True)
class Done:
    """The execution's answer (``/execute``'s body): the provider's result, trimmed."""

    answer: Execution


@dataclass(frozen=True)
class Refused:
    error: ToolgateError


@dataclass(frozen=True)
class Awaiting:
    call_id: str
    approval_url: str


@dataclass(frozen=True)
class Elicit:
    """Ask the user through the client (form or URL mode), then retry with ``request_state``."""

    mode: Mode
    message: str
    call_id: str
    url: str
    request_state: str


Outcome = Done | Refused | Awaiting | Elicit


def request_key(session: str, request_id: str | int, tool: str, arguments: Any) -> str:
    """The idempotency key of one JSON-RPC request in one session (the module's docstring).
    Any JSON the request carries has a key (ASCII, keys sorted: deterministic; the id's type
    counts, as ``1`` and ``"1"`` are different ids). The arguments count in their recorded
    form, which is bounded in depth (the SDK parses JSON nested far deeper than Python can
    write it again) and differs from them only where they are refused, never run."""
    material = json.dumps(
        [session, request_id, tool, recordable.recorded(arguments)], sort_keys=True
    )
    return "mcp_" + hashlib.sha256(material.encode()).hexdigest()


async def call_tool(state: Services, ask: Ask) -> Outcome:
    """Run ``ask`` as far as toolgate may now; every refusal is a ``Refused``. A decision
    like those of the HTTP routes, so it is counted as one (``app.load``)."""
    try:
        with load.deciding:
            if ask.request_state is not None:
                return await _resume(state, ask)
            tool = state.catalog.tools.get(ask.tool)
            if tool is not None and tool.approval is None and not tool.mutation:
                return await _at_once(state, ask, IdempotencyKey(None, False))
            key = request_key(ask.session, ask.request_id, ask.tool, ask.arguments)
            if tool is not None and tool.approval is None and not tool.require_dry_run:
                return await _at_once(state, ask, IdempotencyKey(key, True))
            return await _replayed(state, ask, key) or await _first(state, ask, key)
    except ToolgateError as error:
        return Refused(error)


async def _at_once(state: Services, ask: Ask, key: IdempotencyKey) -> Outcome:
    """A call that can never need a preview or an approval (the catalog gives a tool without
    an ``approval`` section no way to be high impact) runs as REST's ``/execute`` runs it:
    one decision, then the provider. Reading again is no harm, so a resent read reads again;
    a mutation runs under its request's ``key``, so a resend is answered from its record."""
    body = _body(ExecuteBody, tool=ask.tool, arguments=ask.arguments, run_id=ask.run_id)
    return Done((await service.execute(state, ask.principal, body, key)).body)


async def _replayed(state: Services, ask: Ask, key: str) -> Outcome | None:
    """A resend: the execution under ``key`` answers it (re-authorized, never run again)."""
    principal = ask.principal
    async with state.db.connection() as conn:
        record = await store.get_execution(conn, principal.tenant, principal.sub, key)
    if record is None:
        return None
    return await _execute(state, ask, record.call_id, key)


async def _first(state: Services, ask: Ask, key: str) -> Outcome:
    """A call that needs an approval is looked for (``_standing``) and, if there is none,
    proposed, under a lock on the actor's tool and arguments: identical requests sent at
    once would otherwise each open a request for approval, and each approved one run."""
    tool = state.catalog.tools.get(ask.tool)
    call = _prepared(tool, ask) if tool is not None and tool.approval is not None else None
    if tool is None or call is None:
        return await _propose(state, ask, key)
    lock = (
        "mcp-first:"
        + hashlib.sha256(
            f"{ask.principal.tenant}\0{ask.principal.sub}\0{tool.name}\0{call.fingerprint}".encode()
        ).hexdigest()
    )
    async with state.locks.hold(lock, lock_ttl(tool)) as held:
        if not held:
            raise IdempotencyInFlight("the same call is being proposed by another request")
        standing = await _standing(state, ask, tool, call.fingerprint)
        if standing is not None and standing.state == "approved":
            try:
                return await _execute(state, ask, standing.id, key)
            except ApprovalStale:  # preview again: that reopens the call for approvers
                await service.dry_run(state, ask.principal, DryRunBody(call_id=standing.id))
                return await _approval(state, ask, standing.id, key)
        if standing is not None:
            return await _approval(state, ask, standing.id, key)
        return await _propose(state, ask, key)


async def _propose(state: Services, ask: Ask, key: str) -> Outcome:
    """A new call: proposed, previewed when it needs it, then run or put to approvers."""
    proposal = await service.propose(
        state,
        ask.principal,
        _body(ProposeBody, tool=ask.tool, arguments=ask.arguments, run_id=ask.run_id),
    )
    call_id, next_step = proposal["call_id"], proposal["next"]
    if next_step == "dry_run":
        preview = await service.dry_run(state, ask.principal, DryRunBody(call_id=call_id))
        next_step = preview["next"]
    if next_step == "execute":
        return await _execute(state, ask, call_id, key)
    return await _approval(state, ask, call_id, key)


def _prepared(tool: Tool, ask: Ask) -> PreparedCall | None:
    """The call as toolgate normalizes it; ``None`` for arguments that do not even prepare
    (proposing them records their denial)."""
    try:
        return policy.prepare(tool, policy.completed(tool, ask.principal, ask.arguments))
    except ToolgateError:
        return None


async def _standing(state: Services, ask: Ask, tool: Tool, fingerprint: str) -> CallRow | None:
    """The actor's call of this tool with these arguments, in the same run (or none), that
    awaits or holds an approval (``store.standing``), if any."""
    assert tool.approval is not None
    async with state.db.connection() as conn:
        return await store.standing(
            conn,
            ask.principal.tenant,
            ask.principal.sub,
            tool.name,
            fingerprint,
            ask.run_id,
            tool.approval.ttl_s,
        )


async def _execute(state: Services, ask: Ask, call_id: str, key: str) -> Outcome:
    """``/execute`` of the stored call ``call_id`` (which must be of the asked tool) with
    ``key`` (reads ignore it)."""
    body = _body(ExecuteBody, call_id=call_id, tool=ask.tool, run_id=ask.run_id)
    answer = await service.execute(state, ask.principal, body, IdempotencyKey(key, True))
    return Done(answer.body)


async def _approval(state: Services, ask: Ask, call_id: str, key: str) -> Outcome:
    """Ask for the approval of ``call_id``: in a form where the actor may approve their own
    call, else through the console's page for it; a client that cannot be asked is told
    the call awaits approval."""
    url = f"{ask.console}/console/calls/{call_id}"
    tool = state.catalog.tools.get(ask.tool)
    own = (
        tool is not None
        and tool.approval is not None
        and rules.may_approve(
            ask.principal, ask.principal.sub, ask.principal.tenant, tool.approval.approvers
        )
    )
    mode: Mode | None = "form" if own and "form" in ask.elicitation else None
    if mode is None and "url" in ask.elicitation:
        mode = "url"
    if mode is None:
        return Awaiting(call_id, url)
    proposal, latest = await history.to_decide(state, ask.principal, call_id)
    arguments = {**(proposal["arguments"] or {}), **(proposal.get("sensitive_arguments") or {})}
    lines = [
        f"toolgate: {ask.tool} needs an approval before it runs.",
        f"Arguments: {json.dumps(arguments, sort_keys=True)}",
    ]
    if proposal["taint"]:  # what the console shows approvers: where they came from
        sources = ", ".join(
            f"{t['argument']} (from {t['source_call_id']})" for t in proposal["taint"]
        )
        lines.append(f"Copied from untrusted results the run read: {sources}")
    if latest is not None:
        lines.append(f"Preview: {json.dumps(latest['snapshot'], sort_keys=True)}")
    lines.append(
        "Approve or reject it here." if mode == "form" else f"An approver decides it at {url}"
    )
    request_state = json.dumps(
        {
            "call_id": call_id,
            "key": key,
            "snapshot_hash": latest["snapshot_hash"] if latest else None,
        }
    )
    return Elicit(mode, "\n".join(lines), call_id, url, request_state)


async def _resume(state: Services, ask: Ask) -> Outcome:
    """The client's retry after toolgate's input request: the actor's own decision (form),
    or the approver's, awaited for a while (URL); then the call runs under the original
    request's key."""
    call_id, key, snapshot_hash = _parse_state(ask.request_state)
    replay = await _replayed(state, ask, key)
    if replay is not None:
        return replay
    call = await visible_call(state.db, ask.principal, call_id)
    if call.tool != ask.tool:
        raise InvalidRequest("requestState names a call of another tool")
    if call.state == "rejected":
        raise ApprovalRejected("the approver rejected this call", call_id=call_id)
    if call.state not in ("awaiting_approval", "approved"):
        raise InvalidRequest("requestState names a call that awaits no approval")
    url = f"{ask.console}/console/calls/{call_id}"
    answer = ask.answer or {}
    if answer.get("action") != "accept":
        return Awaiting(call_id, url)  # declined or dismissed: the call waits for approvers
    content = answer.get("content")
    if isinstance(content, dict) and "decision" in content:
        decision = content["decision"]
        body = _body(
            ApproveBody,
            call_id=call_id,
            snapshot_hash=snapshot_hash,
            decision=decision,
            comment="decided through MCP elicitation",
        )
        await approvals.approve(state, ask.principal, body)
        if body.decision == "reject":
            raise ApprovalRejected("you rejected this call", call_id=call_id)
        return await _execute(state, ask, call_id, key)
    decided = await history.history_after(state, ask.principal, call_id, MAX_WAIT_S)
    if decided["state"] == "approved":
        return await _execute(state, ask, call_id, key)
    if decided["state"] == "rejected":
        raise ApprovalRejected("the approver rejected this call", call_id=call_id)
    return Awaiting(call_id, url)


def _parse_state(text: str | None) -> tuple[str, str, str | None]:
    """``requestState`` as ``_approval`` wrote it, or ``invalid_request``: it comes from the
    client, so every member is checked for what toolgate would have written there."""
    forged = InvalidRequest("requestState is not one toolgate gave")
    try:
        parsed = orjson.loads(text or "")  # nesting past orjson's limit is a decode error
        call_id, key, snapshot_hash = parsed["call_id"], parsed["key"], parsed["snapshot_hash"]
        call_id = DryRunBody.model_validate({"call_id": call_id}).call_id  # storable text
    except (ValueError, TypeError, KeyError):  # ValidationError is a ValueError
        raise forged from None
    if not isinstance(key, str) or IdempotencyKey.parse(key).value != key:
        raise forged
    if not isinstance(snapshot_hash, str | None):
        raise forged
    return call_id, key, snapshot_hash


def _body(model: type[B], **fields: Any) -> B:
    """A use case's command (REST's request body) built from MCP input, refused as
    ``invalid_request`` as REST would refuse the body."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise malformed(exc.errors(), skip=0) from None
