"""One request pipeline: every route, the decision endpoints and anything mounted included,
passes through the same middleware and exception handlers, so a concern added the ordinary
way (``app.add_middleware``) applies to all of them, and every error is a problem."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.main import MAX_BODY_BYTES, create_app
from app.routing import DecisionRoute
from app.settings import Settings
from tests.conftest import Providers
from tests.flows import Auth

UNAUTHENTICATED = {"/healthz", "/readyz", "/metrics"}
"""The API's routes that need no token."""


class Seen:
    """A middleware as anybody would add one: it notes every request it sees."""

    requests: list[tuple[str, str]]

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            Seen.requests.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


@pytest.fixture
async def pipeline(
    settings: Settings, clean: None, providers: Providers
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app as it ships (its MCP endpoint included), plus ``Seen`` and a mounted Starlette
    sub-application."""
    app = create_app(settings)
    app.add_middleware(Seen)
    app.mount("/mounted", Starlette(routes=[Route("/ping", lambda _: PlainTextResponse("pong"))]))
    Seen.requests = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as client:
            yield app, client


def routes(app: FastAPI) -> list[APIRoute]:
    """Every FastAPI route of the app, through the routers it includes."""
    found = [context.original_route for context in iter_route_contexts(app.routes)]
    return [route for route in found if isinstance(route, APIRoute)]


def api_routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every endpoint the API describes, path parameters filled in."""
    return [
        (
            method,
            route.path.replace("{call_id}", "call_x")
            .replace("{run_id}", "run_x")
            .replace("{kind}", "payee")
            .replace("{value:path}", "x"),
        )
        for route in routes(app)
        if route.include_in_schema
        for method in sorted(route.methods or ())
    ]


async def test_a_middleware_added_the_ordinary_way_sees_every_route(
    pipeline: tuple[FastAPI, httpx.AsyncClient], auth: Auth
) -> None:
    _, client = pipeline
    read = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
    proposed = await client.post("/propose", json=read, headers=auth())
    assert proposed.status_code == 200, proposed.text
    call_id = proposed.json()["call_id"]
    answers = [
        await client.post("/dry-run", json={"call_id": call_id}, headers=auth()),
        await client.post("/execute", json=read, headers=auth()),
        await client.post(
            "/approve",
            json={"call_id": call_id, "snapshot_hash": None, "decision": "approve"},
            headers=auth("bob", roles="support_lead"),
        ),
        await client.post("/runs", json={}, headers=auth()),
        await client.get("/audit", headers=auth(roles="auditor")),
        await client.get(f"/calls/{call_id}", headers=auth()),
        await client.get("/mounted/ping"),
        await client.post("/mcp", json={}),
    ]
    assert [a.status_code for a in answers] == [400, 200, 400, 200, 200, 200, 200, 401]
    assert Seen.requests == [
        ("POST", "/propose"),
        ("POST", "/dry-run"),
        ("POST", "/execute"),
        ("POST", "/approve"),
        ("POST", "/runs"),
        ("GET", "/audit"),
        ("GET", f"/calls/{call_id}"),
        ("GET", "/mounted/ping"),
        ("POST", "/mcp"),
    ]


async def test_the_decision_endpoints_are_decision_routes_of_the_apps_router(
    pipeline: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, _ = pipeline
    decisions = {r.path for r in routes(app) if isinstance(r, DecisionRoute)}
    assert decisions == {"/propose", "/dry-run", "/execute", "/approve"}
    paths = [r.path for r in routes(app)]
    assert all(paths.count(path) == 1 for path in decisions)


async def test_every_error_on_every_route_is_a_problem(
    pipeline: tuple[FastAPI, httpx.AsyncClient], auth: Auth
) -> None:
    """Unauthenticated, a method the route does not take, a body too large, NUL in the
    query: the same problem document on every endpoint, whoever serves it."""
    app, client = pipeline
    routes = api_routes(app)
    assert len(routes) >= 15
    answers: list[tuple[str, int, httpx.Response]] = []
    for method, path in routes:
        if path not in UNAUTHENTICATED:
            answers.append((f"{method} {path}", 401, await client.request(method, path)))
        if ("DELETE", path) not in routes:  # a method the endpoint does not take
            answers.append((f"DELETE {path}", 405, await client.delete(path, headers=auth())))
        answers.append(
            (f"{method} {path}?q=%00", 400, await client.request(method, f"{path}?q=%00"))
        )
        if method == "POST":
            large = b"{" + b" " * MAX_BODY_BYTES + b"}"
            answers.append(
                (f"large {path}", 413, await client.post(path, content=large, headers=auth()))
            )
    answers.append(("unknown path", 404, await client.get("/nowhere", headers=auth())))
    answers.append(("NUL in a path", 404, await client.get("/calls/a%00b", headers=auth())))
    for name, status, response in answers:
        assert response.status_code == status, (name, response.text)
        assert response.headers["content-type"] == "application/problem+json", name
        problem = response.json()
        assert problem["status"] == status, name
        assert problem["type"] == f"urn:toolgate:error:{problem['code']}", name


def test_a_decision_route_refuses_a_parameter_it_cannot_bind() -> None:
    """The lean call path never silently drops what FastAPI would have done."""

    async def with_query(limit: int) -> Any:
        return None

    async def with_plain_body(body: dict[str, Any]) -> Any:
        return None

    for endpoint in (with_query, with_plain_body):
        with pytest.raises(TypeError, match="decision route"):
            DecisionRoute("/x", endpoint, methods=["POST"])
