"""/propose and read /execute through the ASGI app, against real PostgreSQL and providers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import httpx

from app.main import MAX_BODY_BYTES
from tests.conftest import Providers

Auth = Callable[..., dict[str, str]]


async def audit_events(db: asyncpg.Connection) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await db.fetch("SELECT * FROM audit_events ORDER BY seq")
    return rows


def paths(requests: list[dict[str, object]]) -> list[str]:
    return [f"{r['method']} {r['path']}" for r in requests]


async def test_a_read_proposal_is_allowed_and_recorded(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    response = await client.post(
        "/propose",
        json={"tool": "get_order", "arguments": {"order_id": "ord_1"}},
        headers=auth(),
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["decision"] == "allow"
    assert (body["impact"], body["next"], body["mutation"]) == ("read", "execute", False)
    assert body["target"] == {"type": "order", "id": "ord_1"}
    assert body["proposed_by"] == "model"
    assert body["authorized_by"] == {
        "kind": "policy",
        "sub": "alice",
        "tenant": "acme",
        "policy_version": body["policy_version"],
    }
    row = await db.fetchrow("SELECT * FROM calls WHERE id = $1", body["call_id"])
    assert row is not None
    assert (row["decision"], row["state"], row["actor"]) == ("allow", "proposed", "alice")
    [event] = await audit_events(db)
    assert (event["event"], event["call_id"], event["decision"]) == (
        "proposed",
        body["call_id"],
        "allow",
    )


async def test_another_tenants_record_is_refused_and_never_fetched(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    for endpoint in ("/propose", "/execute"):
        response = await client.post(
            endpoint,
            json={"tool": "get_order", "arguments": {"order_id": "ord_9"}},
            headers=auth(),
        )
        assert response.status_code == 403
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "tool_forbidden"
        assert "globex" not in response.text
    assert paths(await providers.requests()) == ["GET /billing/orders/ord_9/owner"] * 2
    events = await audit_events(db)
    assert [(e["event"], e["code"]) for e in events] == [("denied", "tool_forbidden")] * 2
    assert await db.fetchval("SELECT count(*) FROM calls WHERE decision = 'deny'") == 2


async def test_a_missing_record_and_another_tenants_look_the_same(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    bodies = []
    for order in ("ord_9", "ord_nope"):
        response = await client.post(
            "/propose",
            json={"tool": "get_order", "arguments": {"order_id": order}},
            headers=auth(),
        )
        assert response.status_code == 403
        body = response.json()
        body.pop("call_id")
        bodies.append(body)
    assert bodies[0] == bodies[1]


async def test_a_model_supplied_user_id_is_identity_spoof(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    arguments = {"order_id": "ord_1", "amount": 20, "customer_id": "dave", "note": "secret!"}
    response = await client.post(
        "/propose", json={"tool": "issue_refund", "arguments": arguments}, headers=auth()
    )
    assert response.status_code == 403
    assert response.json()["code"] == "identity_spoof"
    assert await providers.requests() == []
    [event] = await audit_events(db)
    assert (event["event"], event["code"]) == ("denied", "identity_spoof")
    assert event["arguments"]["note"] == "[redacted]"


async def test_a_mutation_for_the_session_user_is_allowed_with_next_step(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    for amount, impact in ((20, "low"), (150, "high")):
        response = await client.post(
            "/propose",
            json={
                "tool": "issue_refund",
                "arguments": {"order_id": "ord_1", "amount": amount, "customer_id": "alice"},
            },
            headers=auth(),
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["impact"], body["next"]) == (impact, "dry_run")
        assert body["arguments"]["currency"] == "EUR"


async def test_egress_to_loopback_is_refused(
    client: httpx.AsyncClient, auth: Auth, providers: Providers
) -> None:
    arguments = {
        "order_id": "ord_1",
        "amount": 20,
        "customer_id": "alice",
        "notify_url": "http://127.0.0.1:9100/_control/reset",
    }
    response = await client.post(
        "/propose", json={"tool": "issue_refund", "arguments": arguments}, headers=auth()
    )
    assert response.status_code == 403
    assert response.json()["code"] == "tool_forbidden"


async def test_a_role_outside_the_tool_is_forbidden_without_lookups(
    client: httpx.AsyncClient, auth: Auth, providers: Providers
) -> None:
    response = await client.post(
        "/propose",
        json={
            "tool": "issue_refund",
            "arguments": {"order_id": "ord_1", "amount": 5, "customer_id": "dave"},
        },
        headers=auth("dave", roles="customer"),
    )
    assert response.status_code == 403
    assert response.json()["code"] == "tool_forbidden"
    assert await providers.requests() == []


async def test_unknown_tools_and_invalid_arguments_are_recorded_denials(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    unknown = await client.post("/propose", json={"tool": "rm_rf", "arguments": {}}, headers=auth())
    assert (unknown.status_code, unknown.json()["code"]) == (404, "unknown_tool")
    invalid = await client.post(
        "/propose",
        json={"tool": "get_order", "arguments": {"order_id": "../admin"}},
        headers=auth(),
    )
    assert (invalid.status_code, invalid.json()["code"]) == (422, "invalid_arguments")
    assert invalid.json()["errors"][0]["path"] == "/order_id"
    codes = [e["code"] for e in await audit_events(db)]
    assert codes == ["unknown_tool", "invalid_arguments"]


async def test_malformed_bodies_are_invalid_requests(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    cases: list[dict[str, Any]] = [
        {"json": {"tool": "get_order", "arguments": {}, "actor": "root"}},
        {"json": {"tool": "get_order", "arguments": ["x"]}},
        {"json": {"arguments": {}}},
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        {"content": b'{"tool": "get_order", "arguments": {}}'},
        {
            "content": b'{"tool": "get_order", "arguments": {}}',
            "headers": {"content-type": "text/plain"},
        },
    ]
    for case in cases:
        headers = {**auth(), **case.pop("headers", {})}
        response = await client.post("/propose", headers=headers, **case)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_request"
    assert await db.fetchval("SELECT count(*) FROM calls") == 0


async def test_decision_paths_answer_other_methods_and_near_misses_as_fastapi_does(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    """The decision endpoints are ``DecisionRoute``s in FastAPI's router: another method on
    their paths, or a path near them, is answered as on any other route."""
    for path in ("/propose", "/dry-run", "/execute", "/approve"):
        response = await client.get(path, headers=auth())
        assert response.status_code == 405, (path, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert "POST" in response.headers["allow"]
    unknown = await client.post("/execute/x", json={}, headers=auth())
    assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")
    unauthenticated = await client.post("/execute", json={})
    assert (unauthenticated.status_code, unauthenticated.json()["code"]) == (401, "unauthenticated")
    assert unauthenticated.headers["www-authenticate"] == "Bearer"


async def test_a_json_body_may_name_its_charset(client: httpx.AsyncClient, auth: Auth) -> None:
    response = await client.post(
        "/propose",
        content=b'{"tool": "get_order", "arguments": {"order_id": "ord_1"}}',
        headers={**auth(), "content-type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 200, response.text


async def test_a_read_executes_trimmed_with_identity_headers(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    response = await client.post(
        "/execute",
        json={"tool": "get_order", "arguments": {"order_id": "ord_1"}},
        headers=auth(),
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "succeeded"
    assert body["provider_status"] == 200
    assert body["trust"] == "untrusted"
    assert body["replayed"] is False
    assert set(body["result"]) == {"id", "status", "eta", "amount"}
    forwarded = (await providers.requests())[-1]
    assert forwarded["path"] == "/billing/orders/ord_1"
    assert forwarded["headers"]["X-Toolgate-Actor"] == "alice"
    assert forwarded["headers"]["X-Toolgate-Tenant"] == "acme"
    assert forwarded["headers"]["X-Toolgate-Call-Id"] == body["call_id"]
    assert forwarded["headers"]["traceparent"].startswith("00-")
    [event] = await audit_events(db)
    assert (event["event"], event["outcome"]["status"]) == ("executed", "succeeded")
    assert event["provider_ms"] is not None


async def test_a_read_the_provider_answered_with_a_5xx_is_a_504_recorded_as_failed(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    """A 5xx says nothing certain; a read has nothing to reconcile, so it is recorded as
    failed, with the provider's status, and answered as an unknown outcome."""
    await providers.fault("/billing/orders/ord_1", "status_500")
    response = await client.post(
        "/execute", json={"tool": "get_order", "arguments": {"order_id": "ord_1"}}, headers=auth()
    )
    assert response.status_code == 504, response.text
    problem = response.json()
    assert (problem["code"], problem["status"]) == ("provider_timeout", "unknown")
    sent = paths(await providers.requests())
    assert sent == ["GET /billing/orders/ord_1/owner", "GET /billing/orders/ord_1"]
    state = await db.fetchval("SELECT state FROM calls WHERE id = $1", problem["call_id"])
    assert state == "failed"
    [event] = await audit_events(db)
    assert event["event"] == "failed"
    assert event["outcome"] == {"status": "failed", "provider_status": 500}
    assert event["provider_ms"] is not None


async def test_executing_a_proposed_read_reuses_its_call(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    args = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
    proposed = (await client.post("/propose", json=args, headers=auth())).json()
    executed = await client.post(
        "/execute", json={**args, "call_id": proposed["call_id"]}, headers=auth()
    )
    assert executed.json()["call_id"] == proposed["call_id"]
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", proposed["call_id"]) == (
        "succeeded"
    )
    other = await client.post(
        "/execute", json={**args, "call_id": proposed["call_id"]}, headers=auth("bob")
    )
    assert (other.status_code, other.json()["code"]) == (404, "not_found")


async def test_owner_user_reads_are_the_users_own_and_redacted(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    own = await client.post(
        "/execute",
        json={"tool": "get_customer", "arguments": {"customer_id": "cus_dave"}},
        headers=auth("dave", roles="customer"),
    )
    assert own.status_code == 200, own.text
    assert own.json()["result"]["email"] == "[redacted]"
    someone_else = await client.post(
        "/execute",
        json={"tool": "get_customer", "arguments": {"customer_id": "cus_dave"}},
        headers=auth("erin", roles="customer"),
    )
    assert someone_else.json()["code"] == "tool_forbidden"


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["database"] == "ok"
    assert ready.json()["checks"]["redis"] == "ok"


async def test_a_body_over_the_limit_is_refused_as_a_problem(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    """Declared or streamed, on a decision endpoint or any other POST: 413, nothing stored."""
    padding = "x" * MAX_BODY_BYTES
    body = {"tool": "get_order", "arguments": {"order_id": "ord_1", "pad": padding}}
    declared = await client.post("/propose", json=body, headers=auth())

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"tool": "get_order", "arguments": {"pad": "'
        for _ in range(MAX_BODY_BYTES // 65536 + 1):
            yield b"x" * 65536
        yield b'"}}'

    streamed = await client.post(
        "/execute", content=chunks(), headers={**auth(), "content-type": "application/json"}
    )
    runs = await client.post("/runs", json={"limits": {"pad": padding}}, headers=auth())
    for response in (declared, streamed, runs):
        assert response.status_code == 413, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "invalid_request"
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert await db.fetchval("SELECT count(*) FROM runs") == 0
