"""The agent-framework adapters (``toolgate_client.openai_agents``, ``toolgate_client.langgraph``)
running the real frameworks offline against toolgate behind a real HTTP server and the demo
providers. The model is scripted: the Agents SDK's own ``ScriptedModel``, and LangChain's
``GenericFakeChatModel`` in a LangGraph agent loop. Every test runs on both frameworks;
effects are counted at the provider and stored rows read from the database."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import asyncpg
import pytest
from agents import Agent, RunConfig, Runner, RunResult, RunState, ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from packaging.requirements import Requirement
from toolgate_client import AsyncClient, Retry
from toolgate_client.langgraph import ToolgateNode
from toolgate_client.openai_agents import ToolgateTools
from toolgate_client.tool_calls import execution_key

from tests.conftest import ROOT, Providers

REFUNDS = "/billing/refunds"
REFUND = {"order_id": "ord_1", "amount": 150.0, "currency": None, "notify_url": None, "note": None}
"""A high-impact refund as a model in strict mode sends it: every optional argument null, and
no ``customer_id``, which toolgate fills in from the token."""
QUICK = Retry(attempts=5, backoff_s=0.05, max_backoff_s=0.3)
WAIT_S = 30.0


Turn = tuple[str, dict[str, Any]]


class Agentic(Protocol):
    """One framework's agent loop with toolgate's adapter: the model calls one tool (then
    one more per turn of ``later``), always under the tool-call id ``tc_1`` as some model
    backends do, then answers "done" once it has the tools' output."""

    async def start(self, tool: str, arguments: dict[str, Any], *later: Turn) -> None: ...

    async def resume(self) -> None:
        """Resume the paused run once toolgate has the human's decision."""

    def paused_on(self) -> list[str]:
        """The toolgate call ids the run is paused on."""

    def tool_outputs(self) -> list[str]:
        """What the model was told of its tool calls."""


class OpenAIAgents:
    def __init__(self, client: AsyncClient, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.config = RunConfig(tracing_disabled=True)
        self.model = ScriptedModel()
        self.result: RunResult | None = None
        self.outputs: list[str] = []

    async def start(self, tool: str, arguments: dict[str, Any], *later: Turn) -> None:
        self.tools = ToolgateTools(self.client, run_id=self.run_id)
        self.agent = Agent(name="support", model=self.model, tools=await self.tools.tools())
        conversation: Any = "please"
        for turn, (name, args) in enumerate([(tool, arguments), *later]):
            call = function_call(name, args, call_id="tc_1", item_id=f"fc_{turn}")
            self.model.extend([[call], [assistant_message("done")]])
            result = await self.run(conversation)
            conversation = [*result.to_input_list(), {"role": "user", "content": "more"}]

    async def resume(self) -> None:
        """As a process that was restarted meanwhile would: the run's state read back from
        its serialized form, and the adapter from its saved ``calls``."""
        assert self.result is not None
        saved, calls = self.result.to_state().to_string(), self.tools.calls
        self.tools = ToolgateTools(self.client, run_id=self.run_id, calls=calls)
        self.agent = self.agent.clone(tools=await self.tools.tools())
        state = await RunState.from_string(self.agent, saved)
        decided = await self.tools.resume(state, timeout=WAIT_S)
        await self.run(decided)

    def paused_on(self) -> list[str]:
        assert self.result is not None
        return [self.tools.calls[item.call_id or ""] for item in self.result.interruptions]

    def tool_outputs(self) -> list[str]:
        return self.outputs

    async def run(self, conversation: Any) -> RunResult:
        """One ``Runner.run``, noting what the model was told of its tool calls."""
        self.result = await Runner.run(self.agent, conversation, run_config=self.config)
        self.outputs += [
            str(item.output)
            for item in self.result.new_items
            if isinstance(item, ToolCallOutputItem)
        ]
        return self.result


class LangGraph:
    def __init__(self, client: AsyncClient, run_id: str) -> None:
        self.node = ToolgateNode(client, run_id=run_id)
        self.config: Any = {"configurable": {"thread_id": "t1"}}
        self.out: dict[str, Any] = {}

    async def start(self, tool: str, arguments: dict[str, Any], *later: Turn) -> None:
        turns = [(tool, arguments), *later]
        script = iter(
            [
                AIMessage("", tool_calls=[{"name": name, "args": args, "id": "tc_1"}])
                for name, args in turns
            ]
            + [AIMessage("done")]
        )
        model = GenericFakeChatModel(messages=script)

        async def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", self.node)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        self.graph = builder.compile(checkpointer=InMemorySaver())
        self.out = await self.graph.ainvoke({"messages": [HumanMessage("please")]}, self.config)

    async def resume(self) -> None:
        command = await self.node.resume(self.out, timeout=WAIT_S)
        self.out = await self.graph.ainvoke(command, self.config)

    def paused_on(self) -> list[str]:
        return [pending.value["call_id"] for pending in self.out.get("__interrupt__", ())]

    def tool_outputs(self) -> list[str]:
        messages = self.out["messages"]
        assert messages[-1].content == "done", "the model answered after its tool call"
        return [str(m.content) for m in messages if isinstance(m, ToolMessage)]


@pytest.fixture(params=[OpenAIAgents, LangGraph], ids=["openai-agents", "langgraph"])
async def alice(
    request: pytest.FixtureRequest,
    base_url: str,
    clean: None,
    providers: Providers,
    token: Callable[..., str],
) -> AsyncIterator[Agentic]:
    """Alice's agent, on a run of her own, through toolgate at ``base_url``."""
    async with AsyncClient(base_url, token("alice"), retry=QUICK) as client:
        run = await client.start_run("refund what the customer asks")
        yield request.param(client, run["run_id"])


@pytest.fixture
async def bob(base_url: str, token: Callable[..., str]) -> AsyncIterator[AsyncClient]:
    """A finance approver, deciding through toolgate's REST API."""
    async with AsyncClient(base_url, token("bob", roles="finance_approver")) as client:
        yield client


async def effects(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def decided_while_waiting(alice: Agentic, decide: Any) -> None:
    """Resume ``alice``'s run while ``decide`` is still to come: the adapter waits for it."""
    resuming = asyncio.create_task(alice.resume())
    await asyncio.sleep(0.3)
    assert not resuming.done(), "the run resumed before the human decided"
    await decide
    await asyncio.wait_for(resuming, WAIT_S)


async def test_a_read_reaches_the_model_as_the_providers_untrusted_result(
    alice: Agentic, db: asyncpg.Connection
) -> None:
    await alice.start("get_order", {"order_id": "ord_1"})
    assert alice.paused_on() == []
    (output,) = alice.tool_outputs()
    answer = json.loads(output)
    assert (answer["status"], answer["trust"]) == ("succeeded", "untrusted")
    assert answer["result"]["id"] == "ord_1"
    row = await db.fetchrow("SELECT tool, tool_call_id, run_id, state FROM calls")
    assert row is not None
    assert (row["tool"], row["tool_call_id"], row["state"]) == ("get_order", "tc_1", "succeeded")
    assert row["run_id"] is not None


async def test_a_denial_is_handed_back_to_the_model_with_its_code(
    alice: Agentic, providers: Providers, db: asyncpg.Connection
) -> None:
    await alice.start("get_order", {"order_id": "ord_9"})
    (output,) = alice.tool_outputs()
    assert json.loads(output)["error"] == "tool_forbidden"
    assert "/billing/orders/ord_9" not in [r["path"] for r in await providers.requests()]
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'denied'") == 1


async def test_a_tool_call_id_reused_in_a_later_turn_runs_the_later_call_not_the_first(
    alice: Agentic, providers: Providers, db: asyncpg.Connection
) -> None:
    """Some model backends number tool calls afresh each turn: a later call under an id
    already used is a call of its own, proposed, run and reported as itself."""
    ticket = {"subject": "late parcel", "body": "please check", "order_id": None}
    await alice.start(
        "get_order",
        {"order_id": "ord_9"},
        ("create_ticket", ticket),
        ("get_order", {"order_id": "ord_1"}),
    )
    told = [json.loads(output) for output in alice.tool_outputs()]
    assert [answer.get("error") or answer["status"] for answer in told] == [
        "tool_forbidden",
        "succeeded",
        "succeeded",
    ]
    assert (told[1]["result"]["subject"], told[2]["result"]["id"]) == ("late parcel", "ord_1")
    assert (await providers.stats())["effects_by_path"].get("/support/tickets") == 1
    rows = await db.fetch("SELECT tool, tool_call_id FROM calls ORDER BY created_at")
    assert [tuple(r) for r in rows] == [
        ("get_order", "tc_1"),
        ("create_ticket", "tc_1"),
        ("get_order", "tc_1"),
    ]


async def paused_refund(alice: Agentic, bob: AsyncClient) -> tuple[str, dict[str, Any]]:
    """Alice's model asks for a high-impact refund: her run pauses on it, and the call is in
    Bob's inbox, with its preview. (call id, Bob's inbox item)"""
    await alice.start("issue_refund", REFUND)
    (call_id,) = alice.paused_on()
    (pending,) = await bob.approvals()
    assert (pending["call_id"], pending["actor"]) == (call_id, "alice")
    assert pending["snapshot"] is not None, "the approver sees the preview"
    return call_id, pending


async def ran_once(
    alice: Agentic, call_id: str, providers: Providers, db: asyncpg.Connection
) -> None:
    """The model got the refund's success, and the provider acted once, under the call's key."""
    (output,) = alice.tool_outputs()
    assert json.loads(output)["status"] == "succeeded"
    assert await effects(providers) == 1
    rows = await db.fetch("SELECT idempotency_key, state FROM executions")
    assert [tuple(r) for r in rows] == [(execution_key(call_id), "succeeded")]


async def test_a_high_impact_refund_pauses_until_another_user_approves_then_runs_once(
    alice: Agentic, bob: AsyncClient, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, pending = await paused_refund(alice, bob)
    assert await effects(providers) == 0
    await decided_while_waiting(alice, bob.approve(call_id, pending["snapshot_hash"]))
    await ran_once(alice, call_id, providers, db)
    assert await db.fetchval("SELECT count(*) FROM calls") == 1, "proposed once, not on resume"


async def test_a_rejected_refund_tells_the_model_why_and_has_no_effect(
    alice: Agentic, bob: AsyncClient, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, pending = await paused_refund(alice, bob)
    rejection = bob.approve(
        call_id, pending["snapshot_hash"], decision="reject", comment="too much"
    )
    await decided_while_waiting(alice, rejection)
    (output,) = alice.tool_outputs()
    refused = json.loads(output)
    assert refused["error"] == "approval_rejected"
    assert "too much" in refused["detail"]
    assert await effects(providers) == 0
    assert await db.fetchval("SELECT count(*) FROM executions") == 0


async def test_a_timed_out_refund_is_retried_with_its_key_and_reconciled_to_one_effect(
    alice: Agentic, bob: AsyncClient, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, pending = await paused_refund(alice, bob)
    await bob.approve(call_id, pending["snapshot_hash"])
    await providers.fault(REFUNDS, "stall_after_effect", seconds=1.5)
    await alice.resume()
    await ran_once(alice, call_id, providers, db)
    events = [r["event"] for r in await db.fetch("SELECT event FROM audit_events ORDER BY seq")]
    assert events[-2:] == ["failed", "reconciled"]


def test_the_client_needs_httpx_alone_and_each_framework_only_for_its_adapter() -> None:
    project = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())
    (dependency,) = project["project"]["dependencies"]
    assert dependency.startswith("httpx")
    extras = project["project"]["optional-dependencies"]
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras == {
        "openai-agents": ["openai-agents>=0.24.0,<0.25"],
        "langgraph": ["langgraph>=1.2.22,<2"],
    }
    # Users get ranges; the suite runs the versions the dev extra pins, inside them.
    pinned = {Requirement(r).name: Requirement(r).specifier for r in dev["dev"]}
    for (requirement,) in extras.values():
        wanted = Requirement(requirement)
        (version,) = [str(s.version) for s in pinned[wanted.name] if s.operator == "=="]
        assert wanted.specifier.contains(version), (requirement, version)
    loaded = (
        "import sys, toolgate_client; print(sorted({'agents', 'langgraph'} & set(sys.modules)))"
    )
    found = subprocess.run(
        [sys.executable, "-c", loaded], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "[]"
