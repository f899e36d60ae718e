"""A LangGraph tool node that routes the model's tool calls through toolgate (``pip install
toolgate-client[langgraph]``)::

    tg = ToolgateNode(AsyncClient(url, token=user_jwt), run_id=run_id)
    model = chat_model.bind_tools(await tg.tools())
    builder.add_node("tools", tg)  # where a ToolNode would go, routed to by tools_condition
    out = await graph.ainvoke({"messages": [("user", "Refund 150 EUR on ord_1")]}, config)
    while out.get("__interrupt__"):
        out = await graph.ainvoke(await tg.resume(out), config)

Each tool call of the last AI message is proposed to toolgate (and previewed when the tool has
a dry-run). A call that needs a human pauses the graph with ``interrupt()``; its payload names
the toolgate ``call_id``. ``resume`` waits until the human has decided in toolgate and
answers ``Command(resume=...)`` with that decision (``{"decision": "approve" | "reject",
"comment": ...}``); any other resume value is a rejection, and an approval is still checked
by toolgate when the call runs. Refused calls come back as error ``ToolMessage``s naming the
problem's ``code``.

LangGraph runs a node again from its start when it resumes; the proposal and the execution
are LangGraph tasks, so their results are kept in the checkpoint and neither is repeated.
The graph needs a checkpointer, as every interrupt does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Literal

from langchain_core.messages import ToolCall, ToolMessage
from langgraph.func import task
from langgraph.types import Command, interrupt

from toolgate_client.aio import AsyncClient
from toolgate_client.models import JSON, Outside
from toolgate_client.tool_calls import Decision, Outcome, Prepared, ToolCalls, scoped_run

__all__ = ["KIND", "ToolgateNode"]

KIND = "toolgate.approval"
"""The ``kind`` of this node's interrupt payloads."""


class ToolgateNode:
    """A graph node running the tool calls of ``client``'s user, for one run (``run_id``).
    It reads and answers the state's ``messages_key`` list, as ``ToolNode`` does."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        run_id: str | None = None,
        messages_key: str = "messages",
        tools: list[str] | None = None,
    ) -> None:
        """``tools``: the run's scope, if it has one; the model is shown only those."""
        self._tool_calls = ToolCalls(client, run_id, tools)
        self.messages_key = messages_key
        self._prepare = task(self._prepared)
        self._run = task(self._outcome)

    @classmethod
    async def for_task(
        cls, client: AsyncClient, task: str, *, tools: list[str], outside: Outside = "deny"
    ) -> ToolgateNode:
        """A node for a new run of ``task`` scoped to ``tools``, chosen from the user's
        request before the run reads any data: a call of another tool is refused (or, with
        ``outside="approve"``, needs an approval), and the model is shown only these."""
        run_id, scope = await scoped_run(client, task, tools, outside)
        return cls(client, run_id=run_id, tools=scope)

    async def tools(self) -> list[JSON]:
        """The catalog's tools this user may use, as strict OpenAI tool schemas for
        ``bind_tools``."""
        return await self._tool_calls.schemas("openai")

    async def __call__(self, state: Any) -> dict[str, list[ToolMessage]]:
        calls: list[ToolCall] = getattr(state[self.messages_key][-1], "tool_calls", [])
        return {self.messages_key: [await self._answer(call) for call in calls]}

    async def resume(self, output: Mapping[str, Any], timeout: float | None = None) -> Command[Any]:
        """The ``Command`` resuming ``output``'s interrupts from this node with toolgate's
        decision on each, waited for (``timeout`` seconds at most per call, else
        ``TimeoutError``; ``None``: as long as it takes)."""
        decisions: dict[str, JSON] = {}
        for pending in output.get("__interrupt__", ()):
            value = pending.value
            if isinstance(value, Mapping) and value.get("kind") == KIND:
                decided = await self._tool_calls.decision(value["call_id"], timeout)
                decisions[pending.id] = asdict(decided)
        return Command(resume=decisions)

    async def _answer(self, call: ToolCall) -> ToolMessage:
        prepared = Prepared(**await self._prepare(call))
        if prepared.call_id is None:
            return message(call, Outcome(prepared.refusal or "", ok=False))
        if prepared.needs_approval:
            payload = {"kind": KIND, "call_id": prepared.call_id, "tool": call["name"]}
            decided = decision(interrupt({**payload, "arguments": call["args"]}))
            if decided.decision != "approve":
                return message(call, Outcome(decided.rejection(), ok=False))
        return message(call, Outcome(**await self._run(prepared.call_id)))

    async def _prepared(self, call: ToolCall) -> JSON:
        prepared = await self._tool_calls.prepare(call["name"], call["args"], call["id"])
        return asdict(prepared)

    async def _outcome(self, call_id: str) -> JSON:
        return asdict(await self._tool_calls.run(call_id))


def decision(value: Any) -> Decision:
    """A resume value as a decision: only an explicit approval approves."""
    if not isinstance(value, Mapping):
        return Decision("reject")
    comment = value.get("comment")
    chosen: Literal["approve", "reject"] = (
        "approve" if value.get("decision") == "approve" else "reject"
    )
    return Decision(chosen, comment if isinstance(comment, str) else None)


def message(call: ToolCall, outcome: Outcome) -> ToolMessage:
    status = "success" if outcome.ok else "error"
    return ToolMessage(
        outcome.text, tool_call_id=call["id"] or "", name=call["name"], status=status
    )
