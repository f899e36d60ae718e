"""The MCP front door: the official ``mcp`` client over real HTTP against two running
``toolgate serve`` instances and the demo providers; each client's requests alternate
between the instances, so no step may rely on state kept in a process."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import LATEST_MODERN_VERSION

from app.mcp.router import SESSIONS_PER_USER
from tests.conftest import Providers
from tests.flows import Auth, Flow, new_key, refund_args
from tests.test_instances import Instance, two_instances

pytestmark = pytest.mark.usefixtures("clean")

REFUNDS = "/billing/refunds"
TICKETS = "/support/tickets"
Tokens = Any


@pytest.fixture(scope="module")
async def servers(
    env: dict[str, str], self_approved_catalog: Path
) -> AsyncIterator[list[Instance]]:
    """Two instances sharing PostgreSQL and Redis, where a refund's actor may approve it."""
    async with two_instances({**env, "TOOLGATE_CATALOG": str(self_approved_catalog)}) as started:
        yield started


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next of several instances, as a load balancer may."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = itertools.cycle(ports)
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(port=next(self.ports))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def connected(servers: list[Instance], token: str, **options: Any) -> AsyncIterator[Client]:
    """The official client with ``token``, its requests spread over every instance."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        transport=RoundRobin([s.port for s in servers]),
        timeout=30,
    )
    async with (
        http,
        Client(
            streamable_http_client(servers[0].url + "/mcp", http_client=http), **options
        ) as client,
    ):
        yield client


async def effects(providers: Providers, path: str) -> int:
    return (await providers.stats())["effects_by_path"].get(path, 0)  # type: ignore[no-any-return]


async def call(
    servers: list[Instance], token: str, tool: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    """One tool call by a client of its own."""
    async with connected(servers, token) as client:
        return await client.call_tool(tool, arguments)


def answering(asked: list[types.ElicitRequestParams], answer: types.ElicitResult) -> Any:
    """An elicitation callback that notes what it was asked and answers ``answer``."""

    async def callback(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params)
        return answer

    return callback


APPROVE = types.ElicitResult(action="accept", content={"decision": "approve"})


def in_a_session(servers: list[Instance], token: str, callback: Any) -> Any:
    """A handshake-revision client that elicits through ``callback``: its session lives in
    one instance, so all its requests go there."""
    return connected(servers[:1], token, mode="legacy", elicitation_callback=callback)


def structured(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


async def test_principals_with_different_roles_are_listed_different_tools(
    servers: list[Instance], token: Tokens
) -> None:
    async with connected(servers, token("alice", "acme", "support")) as support:
        support_tools = {t.name: t for t in (await support.list_tools()).tools}
    async with connected(servers, token("carol", "globex", "customer")) as customer:
        customer_tools = {t.name for t in (await customer.list_tools()).tools}
    assert "issue_refund" in support_tools
    assert "issue_refund" not in customer_tools
    assert "get_customer" in customer_tools
    assert "get_customer" not in support_tools
    refund = support_tools["issue_refund"]
    assert "customer_id" not in refund.input_schema["properties"]  # filled from the token
    assert refund.annotations is not None
    assert refund.annotations.destructive_hint is True
    read = support_tools["get_order"].annotations
    assert read is not None
    assert read.read_only_hint is True


async def test_a_read_answers_the_trimmed_result_marked_untrusted(
    servers: list[Instance], token: Tokens, providers: Providers
) -> None:
    result = await call(servers, token(), "get_order", {"order_id": "ord_1"})
    assert result.is_error is False
    answer = structured(result)
    assert answer["status"] == "succeeded"
    assert answer["result"] == {
        "id": "ord_1",
        "status": "shipped",
        "eta": "2026-12-03",
        "amount": 250.0,
    }
    assert result.meta is not None
    assert result.meta["trust"] == "untrusted"


async def test_another_tenants_order_is_an_error_result_and_never_reaches_the_provider(
    servers: list[Instance], token: Tokens, providers: Providers
) -> None:
    result = await call(servers, token(), "get_order", {"order_id": "ord_9"})
    assert result.is_error is True
    assert structured(result)["code"] == "tool_forbidden"
    paths = [r["path"] for r in await providers.requests()]
    assert "/billing/orders/ord_9" not in paths
    assert "/billing/orders/ord_9/owner" in paths


async def test_a_high_impact_refund_awaits_an_approval_and_a_later_identical_call_runs_it_once(
    servers: list[Instance],
    token: Tokens,
    auth: Auth,
    providers: Providers,
    db: asyncpg.Connection,
) -> None:
    args = {"order_id": "ord_1", "amount": 150.0}
    async with connected(servers, token()) as client:
        waiting = await client.call_tool("issue_refund", args)
        again = await client.call_tool("issue_refund", args)
    assert waiting.is_error is False  # waiting is not failing
    pending = structured(waiting)
    assert pending["status"] == "awaiting_approval"
    assert pending["approval_url"].endswith(f"/console/calls/{pending['call_id']}")
    assert structured(again)["call_id"] == pending["call_id"]  # one request for approvers
    async with httpx.AsyncClient(base_url=servers[1].url) as rest:
        flow = Flow(rest, auth)
        inbox = (
            await rest.get("/approvals", headers=auth(sub="bob", roles="finance_approver"))
        ).json()
        assert [item["call_id"] for item in inbox["items"]] == [pending["call_id"]]
        decided = await flow.approve(pending["call_id"], inbox["items"][0]["snapshot_hash"])
        assert decided.status_code == 200, decided.text
    assert await effects(providers, REFUNDS) == 0
    async with connected(servers, token()) as client:
        ran = await client.call_tool("issue_refund", args)
        later = await client.call_tool("issue_refund", args)
    assert ran.is_error is False, ran
    assert (structured(ran)["call_id"], structured(ran)["status"]) == (
        pending["call_id"],
        "succeeded",
    )
    assert structured(later)["status"] == "awaiting_approval"  # a new call: approved once is once
    assert structured(later)["call_id"] != pending["call_id"]
    assert await effects(providers, REFUNDS) == 1
    assert await db.fetchval("SELECT count(*) FROM executions") == 1


async def test_a_client_that_elicits_lets_the_owner_approve_in_a_form_and_the_refund_runs_once(
    servers: list[Instance], token: Tokens, providers: Providers, db: asyncpg.Connection
) -> None:
    asked: list[types.ElicitRequestParams] = []
    approve = answering(asked, APPROVE)
    async with connected(servers, token(), elicitation_callback=approve) as client:
        result = await client.call_tool("issue_refund", {"order_id": "ord_1", "amount": 150.0})
    assert result.is_error is False, result
    assert structured(result)["status"] == "succeeded"
    assert len(asked) == 1
    assert isinstance(asked[0], types.ElicitRequestFormParams)
    assert '"new_balance": 100.0' in asked[0].message  # the approver sees the preview
    assert await effects(providers, REFUNDS) == 1
    approval = await db.fetchrow("SELECT approver, decision, snapshot_hash FROM approvals")
    assert approval is not None
    assert (approval["approver"], approval["decision"]) == ("alice", "approve")
    assert approval["snapshot_hash"] is not None  # bound to the preview the form showed


async def test_an_approver_role_is_asked_through_the_console_page_not_a_form(
    servers: list[Instance], token: Tokens, providers: Providers
) -> None:
    asked: list[types.ElicitRequestParams] = []
    decline = answering(asked, types.ElicitResult(action="decline"))
    args = {"customer_id": "cus_dave", "email": "new@acme.example"}
    async with connected(servers, token(), elicitation_callback=decline) as client:
        result = await client.call_tool("update_customer_email", args)
    assert len(asked) == 1
    assert isinstance(asked[0], types.ElicitRequestURLParams)
    assert structured(result)["status"] == "awaiting_approval"
    assert asked[0].url == structured(result)["approval_url"]
    assert await effects(providers, "/crm/customers/cus_dave") == 0


def envelope(request_id: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": LATEST_MODERN_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }


async def test_a_resent_json_rpc_request_does_not_act_again(
    servers: list[Instance], auth: Auth, providers: Providers
) -> None:
    body = envelope(7, "create_ticket", {"subject": "Broken", "body": "It broke."})
    headers = {
        **auth(),
        "MCP-Protocol-Version": LATEST_MODERN_VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "create_ticket",
        "Accept": "application/json, text/event-stream",
    }
    answers = []
    for server in servers:  # the resend reaches the other instance
        async with httpx.AsyncClient(base_url=server.url) as http:
            answers.append(await http.post("/mcp", json=body, headers=headers))
    first, resent = (a.json()["result"]["structuredContent"] for a in answers)
    assert (first["status"], first["replayed"]) == ("succeeded", False)
    assert (resent["call_id"], resent["replayed"]) == (first["call_id"], True)
    assert await effects(providers, TICKETS) == 1
    async with httpx.AsyncClient(base_url=servers[0].url) as http:
        other = await http.post(
            "/mcp", json=envelope(8, "create_ticket", body["params"]["arguments"]), headers=headers
        )
    assert other.json()["result"]["structuredContent"]["replayed"] is False  # a new request
    assert await effects(providers, TICKETS) == 2


async def test_a_mutation_that_never_needs_an_approval_is_decided_once_as_rest_executes_it(
    servers: list[Instance], auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    """No proposal first: one decision, one call row, one audit row, one effect, as a REST
    ``/execute`` with a key. The resend (the same token: the same session) is answered from
    the record, also when it names a run (as a key used again in a run is over REST):
    nothing acts again."""
    args = {"subject": "Broken", "body": "It broke."}
    token = auth()
    first = await post_call(servers[0], lambda: token, 11, "create_ticket", args)
    again = await post_call(servers[0], lambda: token, 11, "create_ticket", args)
    assert (first["isError"], first["structuredContent"]["status"]) == (False, "succeeded")
    assert again["structuredContent"]["replayed"] is True
    assert await db.fetchval("SELECT count(*) FROM calls") == 1
    events = await db.fetch("SELECT event FROM audit_events ORDER BY seq")
    assert [e["event"] for e in events] == ["executed", "replayed"]
    async with httpx.AsyncClient(base_url=servers[1].url) as rest:
        run_id = (await Flow(rest, auth).post("/runs", {})).json()["run_id"]
    in_run = await post_call(
        servers[1], lambda: token, 11, "create_ticket", args, meta={"run_id": run_id}
    )
    assert in_run["structuredContent"]["replayed"] is True
    assert in_run["structuredContent"]["call_id"] == first["structuredContent"]["call_id"]
    assert await db.fetchval("SELECT count(*) FROM calls") == 1
    assert await effects(providers, TICKETS) == 1


@pytest.mark.parametrize("authorization", [None, "Bearer not-a-token", "Basic YWxpY2U6eA=="])
async def test_a_missing_or_bad_token_is_refused_with_the_resource_metadata(
    servers: list[Instance], authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with httpx.AsyncClient(base_url=servers[0].url) as http:
        refused = await http.post("/mcp", json=envelope(1, "get_order", {}), headers=headers)
        challenge = refused.headers["WWW-Authenticate"]
        metadata_url = challenge.split('resource_metadata="', 1)[1].rstrip('"')
        metadata = await http.get(metadata_url)
    assert refused.status_code == 401
    assert refused.json()["code"] == "unauthenticated"
    assert challenge.startswith("Bearer ")
    assert metadata.status_code == 200
    assert metadata.json()["resource"] == servers[0].url + "/mcp"


async def test_a_client_of_the_handshake_revision_is_served_without_elicitation(
    servers: list[Instance], token: Tokens, providers: Providers
) -> None:
    async with connected(servers, token(), mode="legacy") as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        read = await client.call_tool("get_order", {"order_id": "ord_2"})
        refund = await client.call_tool("issue_refund", refund_args(150.0))
    assert "get_order" in tools
    assert structured(read)["result"]["id"] == "ord_2"
    assert structured(refund)["status"] == "awaiting_approval"
    assert await effects(providers, REFUNDS) == 0


@pytest.mark.parametrize("revision", ["2025-06-18", "2025-11-25"])
async def test_a_handshake_client_that_elicits_approves_its_refund_in_the_stream_and_it_runs_once(
    servers: list[Instance],
    token: Tokens,
    providers: Providers,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    revision: str,
) -> None:
    """Asked in the stream of its ``tools/call`` (its session's instance alone answers)."""
    monkeypatch.setattr("mcp.client.session.LATEST_HANDSHAKE_VERSION", revision)
    asked: list[types.ElicitRequestParams] = []
    approve = answering(asked, APPROVE)
    async with in_a_session(servers, token(), approve) as client:
        result = await client.call_tool("issue_refund", refund_args(150.0))
        assert client.protocol_version == revision
    assert result.is_error is False, result
    assert structured(result)["status"] == "succeeded"
    assert [type(question) for question in asked] == [types.ElicitRequestFormParams]
    assert '"new_balance": 100.0' in asked[0].message  # the preview, as the form shows it
    assert await effects(providers, REFUNDS) == 1
    approval = await db.fetchrow("SELECT approver, decision, snapshot_hash FROM approvals")
    preview = await db.fetchval("SELECT snapshot_hash FROM dry_runs")
    assert approval is not None
    assert (approval["approver"], approval["decision"]) == ("alice", "approve")
    assert approval["snapshot_hash"] == preview  # bound to the preview the form showed
    assert await db.fetchval("SELECT count(*) FROM executions") == 1


async def test_identical_calls_of_a_handshake_client_at_once_ask_once_and_run_once(
    servers: list[Instance], token: Tokens, providers: Providers, db: asyncpg.Connection
) -> None:
    asked: list[types.ElicitRequestParams] = []
    approve = answering(asked, APPROVE)
    async with in_a_session(servers, token(), approve) as client:
        results = await asyncio.gather(
            *(client.call_tool("issue_refund", refund_args(150.0)) for _ in range(3))
        )
    answers = [structured(r)["code" if r.is_error else "status"] for r in results]
    assert "succeeded" in answers
    # Sent while the first was proposed: "send it again"; or asked again and found it used.
    assert set(answers) <= {"succeeded", "idempotency_in_flight", "approval_consumed"}, answers
    assert 1 <= len(asked) <= len(results)
    assert await effects(providers, REFUNDS) == 1
    assert await db.fetchval("SELECT count(*) FROM executions") == 1


async def test_a_handshake_client_that_declines_is_told_the_call_waits_for_approvers(
    servers: list[Instance], token: Tokens, providers: Providers, db: asyncpg.Connection
) -> None:
    asked: list[types.ElicitRequestParams] = []
    decline = answering(asked, types.ElicitResult(action="decline"))
    async with in_a_session(servers, token(), decline) as client:
        result = await client.call_tool("issue_refund", refund_args(150.0))
    assert len(asked) == 1
    assert result.is_error is False
    assert structured(result)["status"] == "awaiting_approval"
    assert await effects(providers, REFUNDS) == 0
    assert await db.fetchval("SELECT count(*) FROM approvals") == 0


async def test_a_handshake_client_sent_to_the_console_waits_in_the_stream_for_the_approver(
    servers: list[Instance], token: Tokens, auth: Auth, providers: Providers
) -> None:
    """URL mode (2025-11-25): the client opens the page, a support lead approves there
    meanwhile, and the same ``tools/call`` answers with the change made, once."""
    asked: list[types.ElicitRequestParams] = []
    decided: list[int] = []

    async def open_and_approve(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params)
        assert isinstance(params, types.ElicitRequestURLParams)
        call_id = params.url.rsplit("/", 1)[1]

        async def lead_approves() -> None:
            lead = {"sub": "carol", "roles": "support_lead"}
            async with httpx.AsyncClient(base_url=servers[1].url) as rest:
                inbox = (await rest.get("/approvals", headers=auth(**lead))).json()
                [item] = [item for item in inbox["items"] if item["call_id"] == call_id]
                answer = await Flow(rest, auth).approve(call_id, item["snapshot_hash"], lead)
                decided.append(answer.status_code)

        asyncio.get_running_loop().call_later(0.5, lambda: asyncio.ensure_future(lead_approves()))
        return types.ElicitResult(action="accept")

    args = {"customer_id": "cus_dave", "email": "new@acme.example"}
    async with in_a_session(servers, token(), open_and_approve) as client:
        result = await client.call_tool("update_customer_email", args)
    assert decided == [200]
    assert len(asked) == 1
    assert result.is_error is False, result
    assert structured(result)["status"] == "succeeded"
    assert await effects(providers, "/crm/customers/cus_dave") == 1


def initialize(revision: str, elicitation: dict[str, Any]) -> dict[str, Any]:
    """A handshake client's ``initialize`` that declares ``elicitation``."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": revision,
            "capabilities": {"elicitation": elicitation},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }


async def test_a_session_answers_only_its_principal_and_elsewhere_is_served_statelessly(
    servers: list[Instance], auth: Auth
) -> None:
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=servers[0].url) as http:
        opened = await http.post(
            "/mcp", json=initialize("2025-11-25", {"form": {}}), headers={**auth(), **accept}
        )
        session = opened.headers["mcp-session-id"]
        in_session = {**accept, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        own = await http.post("/mcp", json=listing, headers={**auth(), **in_session})
        other = await http.post("/mcp", json=listing, headers={**auth(sub="bob"), **in_session})
    async with httpx.AsyncClient(base_url=servers[1].url) as http:  # not its instance
        elsewhere = await http.post("/mcp", json=listing, headers={**auth(), **in_session})
    assert opened.status_code == 200, opened.text
    assert own.status_code == 200, own.text
    assert "get_order" in own.text
    assert other.status_code == 404  # bob cannot use, or answer questions in, alice's session
    assert "get_order" not in other.text
    assert elsewhere.status_code == 200, elsewhere.text
    assert "get_order" in {tool["name"] for tool in elsewhere.json()["result"]["tools"]}


async def test_one_user_holds_a_bounded_number_of_sessions_then_is_served_statelessly(
    servers: list[Instance], auth: Auth
) -> None:
    """The sessions of one process are shared by every user: no one user may hold them all."""
    opening = initialize("2025-06-18", {})
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=servers[1].url) as http:
        opened = [
            await http.post("/mcp", json=opening, headers={**auth(sub="erin"), **accept})
            for _ in range(SESSIONS_PER_USER + 1)
        ]
        other = await http.post("/mcp", json=opening, headers={**auth(sub="frank"), **accept})
    assert [answer.status_code for answer in opened] == [200] * (SESSIONS_PER_USER + 1)
    sessions = [answer.headers.get("mcp-session-id") for answer in opened]
    assert None not in sessions[:-1]
    assert sessions[-1] is None  # one more: served, statelessly
    assert opened[-1].json()["result"]["protocolVersion"] == "2025-06-18"
    assert other.headers.get("mcp-session-id") is not None  # another user still gets one


async def post_call(
    server: Instance,
    auth: Auth,
    request_id: int,
    tool: str,
    arguments: dict[str, Any],
    **params: Any,
) -> dict[str, Any]:
    """One current-revision ``tools/call`` by hand; its ``result``. ``params`` join the
    request's params (``requestState``) or, as ``meta``, its ``_meta`` (``run_id``)."""
    body = envelope(request_id, tool, arguments)
    body["params"]["_meta"].update(params.pop("meta", {}))
    body["params"].update(params)
    headers = {
        **auth(),
        "MCP-Protocol-Version": LATEST_MODERN_VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
        "Accept": "application/json, text/event-stream",
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        # As JSON escapes it: the text may hold what UTF-8 cannot (a lone surrogate).
        answer = await http.post(
            "/mcp",
            content=json.dumps(body),
            headers={**headers, "Content-Type": "application/json"},
        )
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("depth", [300, 600])
async def test_arguments_nested_too_deeply_are_a_recorded_invalid_arguments_result(
    servers: list[Instance], auth: Auth, providers: Providers, db: asyncpg.Connection, depth: int
) -> None:
    """The SDK parses deeper JSON than a REST body may hold; past what toolgate can validate
    and store, it is refused and recorded like any invalid argument, not an internal error."""
    deep: Any = []
    for _ in range(depth):
        deep = [deep]
    args = {"subject": "s", "body": "b", "attachments": deep}
    result = await post_call(servers[0], auth, 9, "create_ticket", args)
    assert result["isError"] is True, result
    assert result["structuredContent"]["code"] == "invalid_arguments"
    call = await db.fetchrow("SELECT state, code FROM calls")
    assert call is not None
    assert (call["state"], call["code"]) == ("denied", "invalid_arguments")
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'denied'") == 1
    assert await effects(providers, TICKETS) == 0


async def test_identical_calls_sent_at_once_open_one_request_for_approvers(
    servers: list[Instance], auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    args = {"customer_id": "cus_dave", "email": "dup@acme.example"}
    results = await asyncio.gather(
        *(
            post_call(servers[n % 2], auth, 1400 + n, "update_customer_email", args)
            for n in range(4)
        )
    )
    answers = [r["structuredContent"] for r in results]
    waiting = {a["call_id"] for a in answers if a.get("status") == "awaiting_approval"}
    assert len(waiting) == 1, answers
    assert all(
        a.get("status") == "awaiting_approval" or a.get("code") == "idempotency_in_flight"
        for a in answers
    ), answers
    assert await db.fetchval("SELECT count(*) FROM calls") == 1
    again = await post_call(servers[0], auth, 1500, "update_customer_email", args)
    assert again["structuredContent"]["call_id"] in waiting
    assert await effects(providers, "/crm/customers/cus_dave") == 0


async def test_a_call_approved_outside_a_run_is_not_run_on_the_runs_account(
    servers: list[Instance], auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    args = refund_args(130.0)
    outside = (await post_call(servers[0], auth, 1, "issue_refund", args))["structuredContent"]
    async with httpx.AsyncClient(base_url=servers[1].url) as rest:
        flow = Flow(rest, auth)
        inbox = await rest.get("/approvals", headers=auth(sub="bob", roles="finance_approver"))
        snapshot = inbox.json()["items"][0]["snapshot_hash"]
        assert (await flow.approve(outside["call_id"], snapshot)).status_code == 200
        run = await flow.post("/runs", {"limits": {"max_calls": 5, "max_cost": 0.5}})
        run_id = run.json()["run_id"]
    inside = await post_call(servers[1], auth, 2, "issue_refund", args, meta={"run_id": run_id})
    answer = inside["structuredContent"]
    assert answer["status"] == "awaiting_approval", answer  # a call of its own, in the run
    assert answer["call_id"] != outside["call_id"]
    assert await db.fetchval("SELECT run_id FROM calls WHERE id = $1", answer["call_id"]) == run_id
    assert await effects(providers, REFUNDS) == 0


@pytest.mark.parametrize(
    "malformed", [12345, ["run"], {"id": "run"}, "run_\x00x", "run_\ud800", "", " ", "run x"]
)
@pytest.mark.parametrize(
    ("tool", "args", "path"),
    [
        ("create_ticket", {"subject": "s", "body": "b"}, TICKETS),
        ("issue_refund", refund_args(150.0), REFUNDS),  # looked up as a standing call first
    ],
)
async def test_a_run_id_that_is_not_a_storable_string_is_refused_not_ignored(
    servers: list[Instance],
    auth: Auth,
    providers: Providers,
    db: asyncpg.Connection,
    malformed: Any,
    tool: str,
    args: dict[str, Any],
    path: str,
) -> None:
    """Taken as no run, the call would run outside the limits its client asked for; text
    PostgreSQL cannot hold (NUL, a lone surrogate) names no run either."""
    result = await post_call(servers[0], auth, 6, tool, args, meta={"run_id": malformed})
    assert result["isError"] is True, result
    assert result["structuredContent"]["code"] == "invalid_request"
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert await effects(providers, path) == 0


async def test_a_resend_with_a_run_id_no_body_accepts_is_refused_not_an_internal_error(
    servers: list[Instance], auth: Auth, providers: Providers
) -> None:
    """A resend (same request id, tool and arguments) is answered from the first request's
    execution, which was looked up before any body validated the run id: one longer than an
    id may be made the execution's body fail, a JSON-RPC internal error with a traceback."""
    args = {"subject": "s", "body": "b"}
    first = await post_call(servers[0], auth, 8, "create_ticket", args)
    assert first["isError"] is False, first
    again = await post_call(servers[0], auth, 8, "create_ticket", args, meta={"run_id": "r" * 201})
    assert again["isError"] is True, again
    assert again["structuredContent"]["code"] == "invalid_request"
    assert await effects(providers, TICKETS) == 1


async def test_a_stale_approval_is_previewed_again_and_put_back_to_the_approvers(
    servers: list[Instance], auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    args = refund_args(150.0)
    first = (await post_call(servers[0], auth, 1, "issue_refund", args))["structuredContent"]
    bob = auth(sub="bob", roles="finance_approver")
    async with httpx.AsyncClient(base_url=servers[1].url) as rest:
        flow = Flow(rest, auth)
        item = (await rest.get("/approvals", headers=bob)).json()["items"][0]
        assert (await flow.approve(first["call_id"], item["snapshot_hash"])).status_code == 200
        small = await flow.propose("issue_refund", refund_args(30.0))  # changes the preview
        await flow.dry_run(small["call_id"])
        done = await flow.post(
            "/execute", {"call_id": small["call_id"]}, headers={"Idempotency-Key": new_key()}
        )
        assert done.json()["status"] == "succeeded", done.text
    again = (await post_call(servers[0], auth, 2, "issue_refund", args))["structuredContent"]
    assert (again["status"], again["call_id"]) == ("awaiting_approval", first["call_id"])
    async with httpx.AsyncClient(base_url=servers[1].url) as rest:
        reopened = (await rest.get("/approvals", headers=bob)).json()["items"]
    assert [i["call_id"] for i in reopened] == [first["call_id"]]
    assert reopened[0]["snapshot_hash"] != item["snapshot_hash"]
    assert await effects(providers, REFUNDS) == 1  # the small refund only


@pytest.mark.parametrize(
    "state",
    [
        '{"call_id": "call_x", "key": 5, "snapshot_hash": null}',
        '{"call_id": "call_x", "key": ["a"], "snapshot_hash": null}',
        '{"call_id": "call_x\\u0000", "key": "kkkkkkkkkkkkkkkkkkkk", "snapshot_hash": null}',
        '{"call_id": "call_\\ud800", "key": "kkkkkkkkkkkkkkkkkkkk", "snapshot_hash": null}',
        '{"call_id": "call_x", "key": " kkkkkkkkkkkkkkkkkkkk", "snapshot_hash": null}',
        "[" * 100_000 + "]" * 100_000,
        "garbage",
    ],
)
async def test_a_request_state_toolgate_did_not_write_is_an_invalid_request(
    servers: list[Instance], auth: Auth, state: str
) -> None:
    result = await post_call(
        servers[0], auth, 3, "get_order", {"order_id": "ord_1"}, requestState=state
    )
    assert result["isError"] is True
    assert result["structuredContent"]["code"] == "invalid_request"


async def test_the_stateless_endpoint_opens_no_stream_and_ends_no_session(
    servers: list[Instance], auth: Auth
) -> None:
    async with httpx.AsyncClient(base_url=servers[0].url) as http:
        for method in ("GET", "DELETE"):
            answer = await http.request(
                method, "/mcp", headers={**auth(), "Accept": "text/event-stream"}
            )
            assert answer.status_code == 405, answer.text
            assert answer.headers["allow"] == "POST"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_a_body_not_declared_json_is_a_problem_not_plain_text(
    servers: list[Instance], auth: Auth, content_type: str | None
) -> None:
    body = json.dumps(envelope(1, "get_order", {"order_id": "ord_1"}))
    headers = {**auth(), "Accept": "application/json, text/event-stream"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    async with httpx.AsyncClient(base_url=servers[0].url) as http:
        answer = await http.post("/mcp", content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "invalid_request"


async def test_a_request_state_naming_a_call_that_awaits_no_approval_is_refused(
    servers: list[Instance], auth: Auth, providers: Providers
) -> None:
    args = {"subject": "s", "body": "b"}
    async with httpx.AsyncClient(base_url=servers[0].url) as rest:
        proposal = await Flow(rest, auth).propose("create_ticket", args)
    state = json.dumps({"call_id": proposal["call_id"], "key": "k" * 20, "snapshot_hash": None})
    for action in ("decline", "accept"):
        result = await post_call(
            servers[1],
            auth,
            4,
            "create_ticket",
            args,
            requestState=state,
            inputResponses={"approval": {"action": action, "content": {"decision": "approve"}}},
        )
        assert result["structuredContent"]["code"] == "invalid_request", result
    assert await effects(providers, TICKETS) == 0
