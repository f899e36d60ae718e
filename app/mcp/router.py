"""HTTP for the MCP front door: ``/mcp`` (the SDK's Streamable HTTP transport behind
toolgate's bearer-token check) and the protected-resource metadata MCP clients discover
the token issuer from (RFC 9728).

The transport runs stateless: every request carries the token and is verified on its own,
any worker or instance may serve any request, and toolgate issues no ``Mcp-Session-Id``
(so none can let another token in). Clients of the current protocol revision declare
their capabilities with each request; clients of the handshake revisions are served too,
without elicitation (``calls``: their approvals come from approvers elsewhere).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from app.deps import bearer_token, state_of
from app.errors import InvalidRequest, ToolgateError
from app.mcp import server
from app.mcp.caller import SCOPE_KEY, Caller
from app.responses import JSON, problem

PATH = "/mcp"
METADATA = "/.well-known/oauth-protected-resource"


class Endpoint:
    """ASGI at ``/mcp``: the bearer token verified on every request (else 401 naming the
    resource metadata), then the SDK's transport with the caller in the request's scope."""

    def __init__(self) -> None:
        self.manager = StreamableHTTPSessionManager(
            app=server.build(), stateless=True, json_response=True
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transport's task group, for as long as the app runs (entered by its
        lifespan). It lives in a task of its own: the task group must be left in the task
        that entered it, and a lifespan's start and end need not run in one task."""
        started, stopping = asyncio.Event(), asyncio.Event()

        async def serve() -> None:
            async with self.manager.run():
                started.set()
                await stopping.wait()

        task = asyncio.create_task(serve())
        ready = asyncio.create_task(started.wait())
        await asyncio.wait((task, ready), return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if task.done():
            task.result()  # it failed to start: raise why
        try:
            yield
        finally:
            stopping.set()
            await task

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        base_url = str(request.base_url).rstrip("/")
        try:
            token = bearer_token(request)
            state = state_of(request)
            principal = await state.verifier.verify(token)
        except ToolgateError as error:
            challenge = {
                "WWW-Authenticate": f'Bearer resource_metadata="{base_url}{METADATA}{PATH}"'
            }
            await problem(error, challenge if error.status == 401 else None)(scope, receive, send)
            return
        if not _declared_json(request):
            await problem(
                InvalidRequest("an MCP request must be JSON (Content-Type: application/json)")
            )(scope, receive, send)
            return
        scope[SCOPE_KEY] = Caller.verified(state, principal, token, base_url)
        await self.manager.handle_request(scope, receive, send)


def _declared_json(request: Request) -> bool:
    """The content type the SDK's transport takes (``application/json``, any parameters):
    it refuses any other in plain text, which is neither a problem nor JSON-RPC."""
    return request.headers.get("content-type", "").lower().startswith("application/json")


async def metadata(request: Request) -> JSON:
    """Protected-resource metadata: the resource and the issuer whose tokens it takes."""
    base_url = str(request.base_url).rstrip("/")
    issuer = state_of(request).settings.jwt_issuer
    body: dict[str, Any] = {
        "resource": base_url + PATH,
        "bearer_methods_supported": ["header"],
        "resource_name": "toolgate",
    }
    if issuer:
        body["authorization_servers"] = [issuer]
    return JSON(body)


def routes(endpoint: Endpoint) -> list[BaseRoute]:
    return [
        # Stateless: no stream for the server to speak on (GET) and no session to end
        # (DELETE); both are 405, as the transport allows.
        Route(PATH, endpoint, methods=["POST"]),
        Route(METADATA, metadata, methods=["GET"]),
        Route(METADATA + PATH, metadata, methods=["GET"]),
    ]
