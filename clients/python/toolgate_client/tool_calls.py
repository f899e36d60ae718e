"""What the agent-framework adapters share: one user's tool calls in one run, through
toolgate, told to the model as text.

An adapter asks ``prepare`` when the model calls a tool (propose, and preview when the call
needs it, so that an approver sees what would happen), pauses the framework's run when the
answer needs a human, asks ``decision`` once the framework resumes it, and ``run`` to execute.
Nothing here imports a framework.

The idempotency key of a call's execution is made from its toolgate call id: one proposed
call is one intended action, so running the same call again (a resumed run, a restarted
process) replays the stored outcome instead of acting twice. The client retries ``504``,
``409``, ``502`` and ``503`` (toolgate's, or a gateway's) with that key (``Retry``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from toolgate_client._core import MAX_WAIT_S
from toolgate_client.aio import AsyncClient
from toolgate_client.errors import ToolgateError
from toolgate_client.models import JSON, Format, Outside


@dataclass(frozen=True)
class Prepared:
    """A model's tool call after toolgate's decision: refused (``refusal``, the text the
    model gets), or recorded as ``call_id``, which may need a human's approval first."""

    call_id: str | None = None
    needs_approval: bool = False
    refusal: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What the model is told about a call, and whether it is an error."""

    text: str
    ok: bool


@dataclass(frozen=True)
class Decision:
    """A human's decision on a call, as recorded in toolgate."""

    decision: Literal["approve", "reject"]
    comment: str | None = None

    def rejection(self) -> str:
        """The text the model gets for a rejected call."""
        detail = "an approver rejected this call"
        return problem_text(
            "approval_rejected", f"{detail}: {self.comment}" if self.comment else detail
        )


def problem_text(code: str, detail: str, call_id: str | None = None) -> str:
    """A refusal as the model sees it: the problem's ``code`` is the reason to act on."""
    problem: JSON = {"error": code, "detail": detail}
    if call_id is not None:
        problem["call_id"] = call_id
    return json.dumps(problem)


def execution_key(call_id: str) -> str:
    """The one idempotency key of ``call_id``'s execution, of the form keys take whatever
    the (opaque) id looks like."""
    return "call-" + hashlib.sha256(call_id.encode()).hexdigest()[:32]


def tool_name(schema: JSON) -> str | None:
    """A listed tool's name, whatever the format's shape (``{"function": {"name"}}`` or
    ``{"name"}``)."""
    function = schema.get("function")
    found = function.get("name") if isinstance(function, dict) else schema.get("name")
    return found if isinstance(found, str) else None


async def scoped_run(
    client: AsyncClient, task: str, tools: list[str], outside: Outside = "deny"
) -> tuple[str, list[str]]:
    """A run started for ``task`` with its scope: its id and tools."""
    run = await client.start_run(task, tools=tools, outside=outside)
    return run["run_id"], tools


def refusal(error: ToolgateError) -> str:
    return problem_text(error.code, error.detail, error.call_id)


class ToolCalls:
    """``client``'s user's tool calls, counted against ``run_id`` when given; ``tools``, the
    run's scope, limits what the model is shown (toolgate refuses the rest anyway)."""

    def __init__(
        self, client: AsyncClient, run_id: str | None = None, tools: list[str] | None = None
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.tools = tools

    async def schemas(self, format: Format) -> list[JSON]:
        """The tools this user may use (within the scope), as strict-mode schemas (an
        optional argument may be ``null``, which toolgate takes as absent) without the
        arguments toolgate fills in from the token."""
        listed = (await self.client.catalog(format, strict=True))["tools"]
        if self.tools is None:
            return listed
        return [tool for tool in listed if tool_name(tool) in self.tools]

    async def prepare(self, tool: str, arguments: JSON, tool_call_id: str | None) -> Prepared:
        try:
            proposal = await self.client.propose(
                tool, arguments, run_id=self.run_id, tool_call_id=tool_call_id
            )
            next_step: str = proposal["next"]
            if next_step == "dry_run":
                next_step = (await self.client.dry_run(proposal["call_id"]))["next"]
        except ToolgateError as error:
            return Prepared(refusal=refusal(error))
        return Prepared(call_id=proposal["call_id"], needs_approval=next_step == "approval")

    async def decision(self, call_id: str, timeout: float | None = None) -> Decision:
        """The decision on ``call_id``, waited for (``timeout`` seconds at most; ``None``:
        as long as it takes). A call that no longer awaits a decision and was not rejected
        counts as approved: executing it is still toolgate's decision."""
        while True:
            call = await self.client.wait_for_call(
                call_id, MAX_WAIT_S if timeout is None else timeout
            )
            if call["state"] == "rejected":
                return Decision("reject", (call["approval"] or {}).get("comment"))
            if call["state"] != "awaiting_approval":
                return Decision("approve")
            if timeout is not None:
                raise TimeoutError(f"call {call_id} still awaits a decision")

    async def run(self, call_id: str) -> Outcome:
        try:
            done = await self.client.execute(call_id, idempotency_key=execution_key(call_id))
        except ToolgateError as error:
            return Outcome(refusal(error), ok=False)
        answer: Any = {"status": done.status, "result": done.result, "trust": done.trust}
        return Outcome(json.dumps(answer), ok=done.status == "succeeded")
