"""toolgate's catalog as OpenAI Agents SDK function tools (``pip install
toolgate-client[openai-agents]``)::

    tg = ToolgateTools(AsyncClient(url, token=user_jwt), run_id=run_id)
    agent = Agent(name="support", tools=await tg.tools())
    result = await Runner.run(agent, "Refund 150 EUR on order ord_1")
    while result.interruptions:
        result = await Runner.run(agent, await tg.resume(result))

Each tool's ``needs_approval`` proposes the call to toolgate (and previews it when the tool
has a dry-run), so the SDK pauses the run exactly when toolgate says the call needs a human.
``resume`` waits until the human has decided in toolgate (its console, an approver UI, the
REST API) and applies that decision with the SDK's own ``approve`` / ``reject``. A refused
call (denied, tainted, rejected) reaches the model as a tool result naming the problem's
``code``; the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunResult, RunResultStreaming, RunState, Tool
from agents.tool_context import ToolContext

from toolgate_client.aio import AsyncClient
from toolgate_client.models import JSON, Outside
from toolgate_client.tool_calls import Prepared, ToolCalls, problem_text, scoped_run

__all__ = ["ToolgateTools"]

NO_CALL = problem_text(
    "invalid_arguments",
    "toolgate has no call for this tool call: its arguments were not one JSON object (or the"
    " run was resumed without ToolgateTools.calls); call the tool again",
)
"""What the model is told of a tool call toolgate never saw; it is not run."""


def asked(tool: str, arguments: Any) -> str:
    """A model's tool call as what it asks for: the tool and its arguments."""
    return json.dumps([tool, arguments], sort_keys=True)


class ToolgateTools:
    """The tools of ``client``'s user, for one session and run (``run_id``). Keep this
    object for the whole run: it knows which toolgate call each of the model's tool calls
    became. To resume a serialized ``RunState`` in another process, save ``calls`` with it
    and pass them back here."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        run_id: str | None = None,
        calls: Mapping[str, str] | None = None,
        tools: list[str] | None = None,
    ) -> None:
        """``tools``: the run's scope, if it has one; the model is shown only those."""
        self._tool_calls = ToolCalls(client, run_id, tools)
        self._names: set[str] = set()
        self._prepared = {
            sdk_id: Prepared(call_id=call_id, needs_approval=True)
            for sdk_id, call_id in (calls or {}).items()
        }
        self._asked: dict[str, str] = {}
        """What each of the model's tool calls asked for (``asked``), by the SDK's call id."""

    @classmethod
    async def for_task(
        cls, client: AsyncClient, task: str, *, tools: list[str], outside: Outside = "deny"
    ) -> ToolgateTools:
        """The tools for a new run of ``task`` scoped to ``tools``, chosen from the user's
        request before the run reads any data: a call of another tool is refused (or, with
        ``outside="approve"``, needs an approval), and the model is shown only these."""
        run_id, scope = await scoped_run(client, task, tools, outside)
        return cls(client, run_id=run_id, tools=scope)

    @property
    def calls(self) -> dict[str, str]:
        """The toolgate call id of each tool call that paused the run, by the SDK's call id."""
        return {
            sdk_id: prepared.call_id
            for sdk_id, prepared in self._prepared.items()
            if prepared.needs_approval and prepared.call_id is not None
        }

    async def tools(self) -> list[Tool]:
        """The catalog's tools this user may use, as the SDK's strict function tools."""
        specs = await self._tool_calls.schemas("openai-responses")
        self._names = {spec["name"] for spec in specs}
        return [self._tool(spec) for spec in specs]

    async def resume(
        self,
        paused: RunResult | RunResultStreaming | RunState[Any],
        timeout: float | None = None,
    ) -> RunState[Any]:
        """The state of the ``paused`` run (a result, or a state read back with
        ``RunState.from_string``) with toolgate's decision on each of this object's calls
        that paused it, waited for (``timeout`` seconds at most per call, else
        ``TimeoutError``; ``None``: as long as it takes). Interruptions of other tools are
        left as they are."""
        state = paused if isinstance(paused, RunState) else paused.to_state()
        for item in state.get_interruptions():
            prepared = self._prepared.get(item.call_id or "")
            if prepared is None and item.tool_name not in self._names:
                continue
            if prepared is None or prepared.call_id is None:
                state.reject(item, rejection_message=NO_CALL)
                continue
            decided = await self._tool_calls.decision(prepared.call_id, timeout)
            if decided.decision == "approve":
                state.approve(item)
            else:
                state.reject(item, rejection_message=decided.rejection())
        return state

    async def _prepare(self, tool: str, arguments: JSON, sdk_id: str) -> Prepared:
        """toolgate's decision on the model's call ``sdk_id``, asked once: the SDK asks
        again when a resumed run reaches a call still awaiting its decision. Some model
        backends reuse ids in later turns (``call_0`` every time): an id asking for another
        tool or other arguments is a new call, proposed anew."""
        prepared = self._prepared.get(sdk_id)
        if prepared is None or not self._same(sdk_id, tool, arguments):
            prepared = await self._tool_calls.prepare(tool, arguments, sdk_id)
            self._prepared[sdk_id] = prepared
            self._asked[sdk_id] = asked(tool, arguments)
        return prepared

    def _same(self, sdk_id: str, tool: str, arguments: Any) -> bool:
        """Whether ``sdk_id`` was prepared for ``tool`` with ``arguments``; a call restored
        from ``calls`` stands for the first tool call it is asked about."""
        return self._asked.setdefault(sdk_id, asked(tool, arguments)) == asked(tool, arguments)

    def _tool(self, spec: JSON) -> FunctionTool:
        name: str = spec["name"]

        async def needs_approval(
            _: RunContextWrapper[Any], arguments: dict[str, Any], sdk_id: str
        ) -> bool:
            return (await self._prepare(name, arguments, sdk_id)).needs_approval

        async def invoke(context: ToolContext[Any], arguments: str) -> str:
            prepared = self._prepared.get(context.tool_call_id)
            try:
                parsed = json.loads(arguments)
            except ValueError:
                return NO_CALL
            if prepared is None or not self._same(context.tool_call_id, name, parsed):
                return NO_CALL
            if prepared.call_id is None:
                return prepared.refusal or NO_CALL
            return (await self._tool_calls.run(prepared.call_id)).text

        return FunctionTool(
            name=name,
            description=spec["description"],
            params_json_schema=spec["parameters"],
            on_invoke_tool=invoke,
            strict_json_schema=bool(spec["strict"]),
            needs_approval=needs_approval,
        )
