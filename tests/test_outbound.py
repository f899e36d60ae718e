"""The outbound HTTP client on its own, against a real local server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from app.outbound import NotSent, Outbound, Uncertain


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


class DroppingServer:
    """Reads each request whole, then drops the connection without answering the first
    ``drops`` of them and answers the rest: a peer that may have acted and went away. It
    keeps listening, so a resend would reach it; it counts every request it read."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.requests: list[str] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(":") for h in lines[1:])
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests.append(lines[0].split()[0])
                if len(self.requests) <= self.drops:
                    writer.close()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def dropping() -> AsyncIterator[tuple[DroppingServer, str]]:
    peer = DroppingServer(drops=1)
    server = await asyncio.start_server(peer._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield peer, f"http://127.0.0.1:{port}"
    server.close()
    await server.wait_closed()


@pytest.fixture
async def outbound() -> AsyncIterator[Outbound]:
    client = Outbound()
    await client.start()
    yield client
    await client.close()


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH", "POST"])
async def test_a_request_sent_once_is_never_resent_after_a_dropped_connection(
    dropping: tuple[DroppingServer, str], outbound: Outbound, method: str
) -> None:
    """A mutation's request is sent ``once``: the drop after the peer read it is uncertain,
    and the peer saw it exactly once, whatever the method."""
    peer, url = dropping
    with pytest.raises(Uncertain):
        await outbound.request(method, url + "/act", timeout_s=5, once=True)
    assert peer.requests == [method]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_without_once_the_http_client_resends_an_idempotent_method_by_itself(
    dropping: tuple[DroppingServer, str], outbound: Outbound, method: str
) -> None:
    """What ``once`` guards against, as the pinned aiohttp does it: the same request again,
    on a new connection, answered as if sent once. Harmless for a read; for a mutation,
    the resend's connect failure was taken for "not sent"."""
    peer, url = dropping
    response = await outbound.request(method, url + "/act", timeout_s=5)
    assert response.status == 200
    assert peer.requests == [method, method]


async def test_a_request_sent_once_to_no_listener_is_certainly_not_sent(
    outbound: Outbound,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for method in ("GET", "PUT", "POST"):
        with pytest.raises(NotSent):
            await outbound.request(method, f"http://127.0.0.1:{port}/act", timeout_s=5, once=True)
