"""The outbound HTTP client on its own, against a real local server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from app.outbound import Outbound


@pytest.fixture
async def cookie_server() -> AsyncIterator[str]:
    """``/set`` sets a cookie; ``/echo`` answers the Cookie header it received."""

    async def set_cookie(request: web.Request) -> web.Response:
        response = web.json_response({"ok": True})
        response.set_cookie("session", "alice-secret", path="/")
        return response

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"cookie": request.headers.get("Cookie")})

    app = web.Application()
    app.router.add_get("/set", set_cookie)
    app.router.add_get("/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    # A host name, not an IP: aiohttp's default jar would keep cookies from it.
    yield f"http://localhost:{port}"
    await runner.cleanup()


async def test_a_providers_cookie_never_reaches_a_later_call(cookie_server: str) -> None:
    """One client serves every principal: a cookie kept from one call would ride along on
    the next user's call to the same provider."""
    outbound = Outbound()
    await outbound.start()
    try:
        first = await outbound.request("GET", cookie_server + "/set", timeout_s=5)
        assert first.status == 200
        later = await outbound.request("GET", cookie_server + "/echo", timeout_s=5)
        assert later.body == {"cookie": None}
    finally:
        await outbound.close()
