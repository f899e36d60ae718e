"""The Python client (``clients/python``) against the real app: the asyncio client through
the app's ASGI interface, the blocking one against a real HTTP server on a loopback port
(its calls run in a thread, as the server shares this event loop). Effects are counted at
the demo providers, and stored rows read from the database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest
from toolgate_client import AsyncClient, Client, Retry, ToolgateError
from toolgate_client._core import Operations, Pause, Walk

from tests.conftest import Providers
from tests.flows import refund_args

Token = Callable[..., str]
REFUNDS = "/billing/refunds"
QUICK = Retry(attempts=5, backoff_s=0.05, max_backoff_s=0.3)
"""Retries fast enough for a test, bounded as in production."""
PATIENT = Retry(attempts=10, backoff_s=0.05, max_backoff_s=0.3)
"""Retries that outlast a 0.6 s stall by at least 0.4 s whatever the jitter (QUICK's may end
after 0.375 s): a request waiting out another must not give up first on a busy machine."""


@pytest.fixture
def as_user(
    app: Any, clean: None, providers: Providers, token: Token
) -> Callable[..., AsyncClient]:
    """An asyncio client through the app's ASGI interface, as the user ``token`` names."""

    def make(sub: str = "alice", roles: str = "support", **options: Any) -> AsyncClient:
        transport = httpx.ASGITransport(app=app)
        options.setdefault("retry", QUICK)
        return AsyncClient(
            "http://toolgate", token(sub, roles=roles), transport=transport, **options
        )

    return make


def counting(sent: list[str]) -> dict[str, Any]:
    """httpx options that note each request's key in ``sent``."""

    async def note(request: httpx.Request) -> None:
        sent.append(request.headers.get("Idempotency-Key", ""))

    return {"event_hooks": {"request": [note]}}


async def effects(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def test_a_read_answers_the_providers_result(as_user: Callable[..., AsyncClient]) -> None:
    async with as_user() as alice:
        done = await alice.execute(tool="get_order", arguments={"order_id": "ord_1"})
    assert (done.status, done.provider_status, done.replayed) == ("succeeded", 200, False)
    assert done.result["id"] == "ord_1"
    assert done.operation_id is None


async def test_a_denial_raises_with_its_problem_code(as_user: Callable[..., AsyncClient]) -> None:
    async with as_user() as alice:
        with pytest.raises(ToolgateError) as raised:
            await alice.propose("get_order", {"order_id": "ord_9"})
    assert (raised.value.status, raised.value.code) == (403, "tool_forbidden")
    assert raised.value.call_id is not None
    assert raised.value.problem["code"] == "tool_forbidden"


async def test_a_policy_refusal_of_execute_is_not_retried(
    as_user: Callable[..., AsyncClient], providers: Providers, db: asyncpg.Connection
) -> None:
    async with as_user() as alice:
        with pytest.raises(ToolgateError) as raised:
            await alice.execute(tool="issue_refund", arguments=refund_args())
    assert raised.value.code in {"approval_required", "dry_run_required"}
    assert raised.value.idempotency_key is not None
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'denied'") == 1
    assert await effects(providers) == 0


async def test_the_blocking_client_takes_a_high_impact_refund_through_approval_to_one_effect(
    base_url: str, clean: None, providers: Providers, token: Token
) -> None:
    def walk() -> tuple[Any, Any]:
        with (
            Client(base_url, token("alice")) as alice,
            Client(base_url, token("bob", roles="finance_approver")) as bob,
        ):
            proposal = alice.propose("issue_refund", refund_args())
            assert (proposal["impact"], proposal["next"]) == ("high", "dry_run")
            preview = alice.dry_run(proposal["call_id"])
            assert [item["call_id"] for item in bob.approvals()] == [proposal["call_id"]]
            bob.approve(proposal["call_id"], preview["snapshot_hash"], comment="ok")
            first = alice.execute(proposal["call_id"])
            again = alice.execute(proposal["call_id"], idempotency_key=first.idempotency_key)
            return first, again

    first, again = await asyncio.to_thread(walk)
    assert (first.status, first.provider_status, first.replayed) == ("succeeded", 201, False)
    assert again.replayed
    assert again.operation_id == first.operation_id
    assert await effects(providers) == 1


async def test_a_timeout_is_retried_with_the_same_key_and_reconciles_to_one_effect(
    as_user: Callable[..., AsyncClient], providers: Providers, db: asyncpg.Connection
) -> None:
    sent: list[str] = []
    async with as_user() as alice, as_user("bob", "finance_approver") as bob:
        proposal = await alice.propose("issue_refund", refund_args())
        preview = await alice.dry_run(proposal["call_id"])
        await bob.approve(proposal["call_id"], preview["snapshot_hash"])
    await providers.fault(REFUNDS, "stall_after_effect", seconds=1.5)
    async with as_user(**counting(sent)) as alice:
        done = await alice.execute(proposal["call_id"], idempotency_key="refund-ord-1-first-try")
    assert (done.status, done.provider_status, done.idempotency_key) == (
        "succeeded",
        201,
        "refund-ord-1-first-try",
    )
    assert sent == ["refund-ord-1-first-try"] * 2
    assert await effects(providers) == 1
    keys = await db.fetch("SELECT idempotency_key, state FROM executions")
    assert [tuple(row) for row in keys] == [("refund-ord-1-first-try", "succeeded")]
    events = [r["event"] for r in await db.fetch("SELECT event FROM audit_events ORDER BY seq")]
    assert events[-2:] == ["failed", "reconciled"]


async def test_a_request_still_in_flight_is_waited_out_and_replayed(
    as_user: Callable[..., AsyncClient], providers: Providers
) -> None:
    args = {"subject": "s", "body": "b"}
    await providers.fault("/support/tickets", "stall_before_effect", seconds=0.6)
    sent: list[str] = []
    async with as_user() as first, as_user(retry=PATIENT, **counting(sent)) as second:
        running = asyncio.create_task(
            first.execute(tool="create_ticket", arguments=args, idempotency_key="ticket-key-000001")
        )
        await asyncio.sleep(0.2)
        waited = await second.execute(
            tool="create_ticket", arguments=args, idempotency_key="ticket-key-000001"
        )
        original = await running
    assert (original.replayed, waited.replayed) == (False, True)
    assert waited.result == original.result
    assert len(sent) >= 2, "the second request was answered 409 and sent again"
    assert set(sent) == {"ticket-key-000001"}
    stats = await providers.stats()
    assert stats["effects_by_path"]["/support/tickets"] == 1


class LosingGateway(httpx.AsyncBaseTransport):
    """A load balancer in front of the app that loses the app's answer to the first
    ``/execute`` (an instance restarted, a proxy timed out) and answers its own HTML 502."""

    def __init__(self, app: Any) -> None:
        self.app = httpx.ASGITransport(app=app)
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.app.handle_async_request(request)
        if request.url.path == "/execute" and not self.lost:
            self.lost += 1
            await response.aread()
            return httpx.Response(502, text="<html>502 Bad Gateway</html>")
        return response


async def test_an_answer_lost_by_a_gateway_is_asked_again_with_the_same_key_and_replayed(
    app: Any, clean: None, providers: Providers, db: asyncpg.Connection, token: Token
) -> None:
    sent: list[str] = []
    gateway = LosingGateway(app)
    options = {"transport": gateway, "retry": QUICK, **counting(sent)}
    async with AsyncClient("http://toolgate", token("alice"), **options) as alice:
        args = {"subject": "s", "body": "b"}
        done = await alice.execute(tool="create_ticket", arguments=args)
    assert gateway.lost == 1
    assert (done.status, done.replayed) == ("succeeded", True)
    assert sent == [done.idempotency_key] * 2
    assert (await providers.stats())["effects_by_path"]["/support/tickets"] == 1
    assert await db.fetchval("SELECT count(*) FROM executions") == 1


async def test_waiting_for_a_call_wakes_when_it_is_approved(
    as_user: Callable[..., AsyncClient],
) -> None:
    async with as_user() as alice, as_user("bob", "finance_approver") as bob:
        proposal = await alice.propose("issue_refund", refund_args())
        preview = await alice.dry_run(proposal["call_id"])
        started = time.monotonic()
        waiter = asyncio.create_task(alice.wait_for_call(proposal["call_id"], timeout=30))
        await asyncio.sleep(0.3)
        assert not waiter.done()
        await bob.approve(proposal["call_id"], preview["snapshot_hash"])
        call = await waiter
    assert call["state"] == "approved"
    assert time.monotonic() - started < 10


async def test_waiting_for_a_call_that_never_moves_returns_it_when_the_time_is_up(
    as_user: Callable[..., AsyncClient],
) -> None:
    async with as_user() as alice:
        proposal = await alice.propose("issue_refund", refund_args())
        await alice.dry_run(proposal["call_id"])
        started = time.monotonic()
        call = await alice.wait_for_call(proposal["call_id"], timeout=0.5)
    assert call["state"] == "awaiting_approval"
    assert 0.4 < time.monotonic() - started < 5


async def test_runs_catalog_and_audit_are_read_through_the_client(
    as_user: Callable[..., AsyncClient],
) -> None:
    async with as_user() as alice, as_user("audra", "auditor") as auditor:
        run = await alice.start_run("look up an order", limits={"max_calls": 5})
        await alice.propose("get_order", {"order_id": "ord_1"}, run_id=run["run_id"])
        assert (await alice.run(run["run_id"]))["counters"]["calls"] == 1
        finished = await alice.finish_run(run["run_id"], "completed")
        catalog = await alice.catalog("openai", strict=True)
        page = await auditor.audit(run_id=run["run_id"])
        exported = await auditor.audit_export(run_id=run["run_id"])
        verified = await auditor.verify_audit()
    assert finished["status"] == "completed"
    assert "get_order" in [tool["function"]["name"] for tool in catalog["tools"]]
    assert [item["event"] for item in page["items"]] == ["proposed"]
    assert exported == page["items"]
    assert verified["first_broken"] is None


@pytest.mark.parametrize(
    ("odd", "refusal"),
    [
        ("../approvals", (404, "not_found")),  # an encoded slash names nothing
        ("x?status=pending", (400, "invalid_request")),  # one segment, and no id's form
        ("%2e%2e/approvals", (404, "not_found")),
    ],
)
async def test_an_id_is_one_path_segment_whatever_it_holds(
    as_user: Callable[..., AsyncClient], odd: str, refusal: tuple[int, str]
) -> None:
    """Ids can come from a model's output: none may point a request, with the user's
    token, at another endpoint or query."""
    async with as_user() as alice:
        for read in (alice.call, alice.run):
            with pytest.raises(ToolgateError) as refused:
                await read(odd)
            assert (refused.value.status, refused.value.code) == refusal


def answered(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "status": status, "detail": code})


def carried(
    answers: list[httpx.Response | httpx.TransportError],
    operation: str = "execute",
    *args: Any,
    **kwargs: Any,
) -> tuple[int, Any]:
    """An operation's plan (by default, execute of ``call_1`` under the key ``k…``) carried
    out against ``answers`` in turn, no I/O: (requests, result or the error raised)."""
    if operation == "execute":
        args, kwargs = ("call_1",), {"idempotency_key": "k" * 16}
    with Client("http://toolgate", "token", retry=Retry(attempts=3)) as client:
        plan = Operations.__dict__[operation].plan(client, *args, **kwargs)
    walk, sent = Walk(plan), 0
    try:
        for step in walk:
            if isinstance(step, Pause):
                continue
            if operation == "execute":
                assert step.headers["Idempotency-Key"] == "k" * 16
            outcome, sent = answers[sent], sent + 1
            if isinstance(outcome, httpx.TransportError):
                walk.fail(outcome)
            else:
                walk.answer(outcome)
    except ToolgateError as error:
        return sent, error
    return sent, walk.result


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (403, "approval_required"),
        (409, "approval_consumed"),
        (422, "idempotency_key_reused"),
        (429, "run_limit_exceeded"),
        (504, "not_a_timeout"),
    ],
)
def test_execute_never_retries_a_refusal(status: int, code: str) -> None:
    sent, error = carried([answered(status, code)] * 3)
    assert sent == 1
    assert (error.code, error.idempotency_key) == (code, "k" * 16)


def test_execute_stops_retrying_when_its_attempts_run_out() -> None:
    sent, error = carried([answered(504, "provider_timeout")] * 3)
    assert sent == 3
    assert (error.status, error.code, error.idempotency_key) == (504, "provider_timeout", "k" * 16)


def test_execute_retries_a_lost_connection_and_reports_it_unreachable_at_the_end() -> None:
    lost = httpx.ConnectError("refused")
    sent, error = carried([lost, answered(502, "provider_unavailable"), lost])
    assert sent == 3
    assert (error.status, error.code) == (0, "unreachable")


def test_an_answer_that_is_not_a_problem_document_still_raises_with_a_code() -> None:
    sent, error = carried([httpx.Response(500, text="<html>internal error</html>")])
    assert sent == 1
    assert (error.status, error.code) == (500, "unexpected_response")


@pytest.mark.parametrize("garbage", ["<html>welcome</html>", "[]", "null"])
def test_a_success_that_is_no_execution_raises_with_its_key(garbage: str) -> None:
    sent, error = carried([httpx.Response(200, text=garbage)])
    assert sent == 1
    assert isinstance(error, ToolgateError), "not a result, nor a JSON decoding error"
    assert (error.status, error.code, error.idempotency_key) == (
        200,
        "unexpected_response",
        "k" * 16,
    )


@pytest.mark.parametrize(
    ("operation", "args"),
    [
        ("propose", ("get_order", {"order_id": "ord_1"})),
        ("dry_run", ("call_1",)),
        ("approve", ("call_1", "hash")),
        ("call", ("call_1",)),
        ("wait_for_call", ("call_1",)),
        ("approvals", ()),
        ("catalog", ()),
        ("start_run", ()),
        ("run", ("run_1",)),
        ("finish_run", ("run_1", "completed")),
        ("audit", ()),
        ("audit_export", ()),
        ("verify_audit", ()),
    ],
)
@pytest.mark.parametrize("garbage", ["<html>welcome</html>", "[]", "null", '{"a": 1}\n[2]\n'])
def test_every_operation_raises_an_unexpected_success_as_a_toolgate_error(
    operation: str, args: tuple[Any, ...], garbage: str
) -> None:
    """A proxy's page (or any body that is not what toolgate sends) answered with 200 is a
    ``ToolgateError`` coded ``unexpected_response``, never a JSON decoding error or a
    result of the wrong shape."""
    sent, error = carried([httpx.Response(200, text=garbage)], operation, *args)
    assert sent == 1
    assert isinstance(error, ToolgateError), f"{operation} gave {error!r}"
    assert (error.status, error.code) == (200, "unexpected_response")


@pytest.mark.parametrize(
    ("operation", "args", "answer"),
    [
        ("approvals", (), {"items": "abc", "next_cursor": None}),
        ("approvals", (), {"next_cursor": None}),
        ("wait_for_call", ("call_1",), {"call_id": "call_1"}),
    ],
)
def test_an_object_of_another_shape_is_an_unexpected_response_not_a_key_error(
    operation: str, args: tuple[Any, ...], answer: dict[str, Any]
) -> None:
    """The members an operation goes on reading must be there, with their types: a
    ``KeyError`` (or a page of single characters) is not what a caller can handle."""
    _, error = carried([httpx.Response(200, json=answer)], operation, *args)
    assert isinstance(error, ToolgateError), f"{operation} gave {error!r}"
    assert (error.status, error.code) == (200, "unexpected_response")


def test_wait_for_call_refuses_a_timeout_that_never_passes() -> None:
    for timeout in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="timeout"):
            carried([], "wait_for_call", "call_1", timeout=timeout)


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_gateways_own_error_page_is_retried_with_the_same_key(status: int) -> None:
    sent, error = carried([httpx.Response(status, text="<html>gateway</html>")] * 3)
    assert sent == 3
    assert (error.status, error.code, error.idempotency_key) == (
        status,
        "unexpected_response",
        "k" * 16,
    )


async def test_an_export_row_holding_a_unicode_line_separator_is_read_whole(
    as_user: Callable[..., AsyncClient],
) -> None:
    """NDJSON separates rows with ``\\n`` alone; JSON leaves U+2028, U+2029 and U+0085 raw in
    a string. Any user who puts one in an argument must not make the export unreadable (or
    misread) for the auditor."""
    async with as_user() as alice, as_user("audra", "auditor") as auditor:
        run = await alice.start_run("odd text")
        with pytest.raises(ToolgateError):
            await alice.propose(
                "get_order", {"order_id": "ord\u2028\u2029\x85"}, run_id=run["run_id"]
            )
        page = await auditor.audit(run_id=run["run_id"])
        exported = await auditor.audit_export(run_id=run["run_id"])
    assert [item["event"] for item in page["items"]] == ["denied"]
    assert exported == page["items"]


async def test_a_run_scoped_from_the_users_request_refuses_and_hides_other_tools(
    as_user: Callable[..., AsyncClient], providers: Providers
) -> None:
    from toolgate_client.langgraph import ToolgateNode
    from toolgate_client.openai_agents import ToolgateTools

    async with as_user() as alice:
        run = await alice.start_run("Where is my order ord_1?", tools=["get_order"])
        assert run["scope"] == {"tools": ["get_order"], "outside": "deny"}
        with pytest.raises(ToolgateError) as refused:
            await alice.propose("issue_refund", refund_args(), run_id=run["run_id"])
        assert (refused.value.status, refused.value.code) == (403, "out_of_scope")
        with pytest.raises(ToolgateError) as wider:
            await alice.narrow_run(run["run_id"], ["get_order", "issue_refund"])
        assert wider.value.code == "invalid_request"
        narrowed = await alice.narrow_run(run["run_id"], [])
        assert narrowed.get("scope") == {"tools": [], "outside": "deny"}
        agents = await ToolgateTools.for_task(alice, "Where is ord_1?", tools=["get_order"])
        assert [tool.name for tool in await agents.tools()] == ["get_order"]
        node = await ToolgateNode.for_task(alice, "Where is ord_1?", tools=["get_order"])
        assert [t["function"]["name"] for t in await node.tools()] == ["get_order"]
    assert (await providers.stats())["effects_by_path"] == {}
