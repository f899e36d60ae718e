"""The last line of defence: an exception nothing expected, on any route, is answered as a
500 problem (``internal_error``) that reveals nothing of it, and still reaches the server,
which logs it. No input is known to cause one (``test_fuzz`` looks for them), so the routes
here raise on purpose."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.routing import DecisionRoute
from app.settings import Settings

SECRET_DETAIL = "connection string postgres://admin:hunter2@db"


async def explode() -> Any:
    raise RuntimeError(SECRET_DETAIL)


def exploding_app(settings: Settings) -> FastAPI:
    """The app with one route that raises as a ``DecisionRoute`` and one as FastAPI's own."""
    app = create_app(settings)
    app.router.add_api_route(
        "/explode", explode, methods=["POST"], route_class_override=DecisionRoute
    )
    app.add_api_route("/explode", explode, methods=["GET"])
    return app


@pytest.fixture
def exploding(settings: Settings) -> FastAPI:
    return exploding_app(settings)


async def request(app: FastAPI, method: str, *, raise_app_exceptions: bool) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as client:
        return await client.request(method, "/explode")


@pytest.mark.parametrize("method", ["POST", "GET"], ids=["decision_route", "fastapi"])
async def test_an_unexpected_exception_is_a_500_problem_that_reveals_nothing(
    exploding: FastAPI, method: str
) -> None:
    response = await request(exploding, method, raise_app_exceptions=False)
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "internal_error"
    assert "hunter2" not in response.text


@pytest.mark.parametrize("method", ["POST", "GET"], ids=["decision_route", "fastapi"])
async def test_an_unexpected_exception_still_reaches_the_server_to_be_logged(
    exploding: FastAPI, method: str
) -> None:
    with pytest.raises(RuntimeError, match="hunter2"):
        await request(exploding, method, raise_app_exceptions=True)


async def test_the_exploding_app_serves_its_other_routes(exploding: FastAPI) -> None:
    """The routes were added to the real app: everything else is as it ships."""
    transport = httpx.ASGITransport(app=exploding)
    async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}


@pytest.mark.parametrize("method", ["POST", "GET"], ids=["decision_route", "fastapi"])
async def test_a_500_problem_is_readable_by_a_console_hosted_elsewhere(
    settings: Settings, method: str
) -> None:
    """The error layer that renders a 500 wraps every middleware, cross-origin included, so
    the problem carries the cross-origin headers itself: for an allowed origin only."""
    app = exploding_app(replace(settings, cors_origins=("https://console.example",)))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as client:
        allowed = await client.request(
            method, "/explode", headers={"Origin": "https://console.example"}
        )
        other = await client.request(method, "/explode", headers={"Origin": "https://evil.example"})
    assert allowed.status_code == other.status_code == 500
    assert allowed.json()["code"] == "internal_error"
    assert allowed.headers["access-control-allow-origin"] == "https://console.example"
    assert "access-control-allow-origin" not in other.headers
