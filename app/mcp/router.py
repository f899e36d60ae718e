"""HTTP for the MCP front door: ``/mcp`` (the SDK's Streamable HTTP transport behind
toolgate's bearer-token check) and the protected-resource metadata MCP clients discover
the token issuer from (RFC 9728).

The transport runs stateless: every request carries the token and is verified on its own,
and any worker or instance may serve any request. Clients of the current protocol revision
declare their capabilities with each request, and are asked for approvals in the answer
they retry with. A client of a handshake revision can only be asked in the stream of its
request, and its answer comes back in a request of its own; so one that declares
elicitation in its ``initialize`` gets a session (``Mcp-Session-Id``) in the process that
answered it, bound to its principal, where the question waits for that answer. Every other
request is served statelessly, including one naming a session this process does not hold
(expired, or another worker's or instance's): it is served as before, and a call that needs
an approval then waits for approvers elsewhere (``calls``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    AuthorizationContext,
    authorization_context,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from app.auth.principal import Principal
from app.deps import bearer_token, state_of
from app.errors import InvalidRequest, ToolgateError
from app.mcp import server
from app.mcp.caller import SCOPE_KEY, Caller
from app.responses import JSON, problem

PATH = "/mcp"
METADATA = "/.well-known/oauth-protected-resource"
ASKING_REVISIONS = frozenset({"2025-06-18", "2025-11-25"})
"""The handshake revisions that define elicitation."""
MAX_SESSIONS = 1_000
"""Sessions one process holds at most; past that, new clients are served statelessly."""
SESSIONS_PER_USER = 8
"""Sessions one user holds at most in one process (so that no one user holds them all)."""
SESSION_IDLE_S = 30 * 60
"""A session without a request in flight for this long ends."""


class Endpoint:
    """ASGI at ``/mcp``: the bearer token verified on every request (else 401 naming the
    resource metadata), then the SDK's transport with the caller in the request's scope:
    its stateless one, or its sessions for handshake clients that can be asked."""

    def __init__(self) -> None:
        self.stateless = StreamableHTTPSessionManager(
            app=server.build(), stateless=True, json_response=True
        )
        self.sessions = StreamableHTTPSessionManager(
            app=server.build(), session_idle_timeout=SESSION_IDLE_S, max_sessions=None
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transport's task group, for as long as the app runs (entered by its
        lifespan). It lives in a task of its own: the task group must be left in the task
        that entered it, and a lifespan's start and end need not run in one task."""
        started, stopping = asyncio.Event(), asyncio.Event()

        async def serve() -> None:
            async with self.stateless.run(), self.sessions.run():
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
        session = request.headers.get(MCP_SESSION_ID_HEADER)
        in_session = session is not None and session in self._owners()
        if session is None and MCP_PROTOCOL_VERSION_HEADER not in request.headers:
            body = await request.body()  # a handshake's first request: small, and bounded
            receive = _replaying(body, receive)
            streams = "text/event-stream" in request.headers.get("accept", "")
            in_session = streams and asks_for_a_session(body) and self._room(principal)
        if not in_session:
            await self.stateless.handle_request(scope, receive, send)
            return
        # The SDK binds a session to the user that opened it: to anyone else it does not
        # exist (so no one else can use it, or answer the questions asked in it).
        scope["user"] = _user(principal)
        await self.sessions.handle_request(scope, receive, send)

    def _owners(self) -> dict[str, AuthorizationContext]:
        """The sessions this process holds, and whose each is (the SDK's own registry: it
        has no public view of it; ``mcp`` is pinned, and the tests fail if the name moves)."""
        owners: dict[str, AuthorizationContext] = self.sessions._session_owners
        return owners

    def _room(self, principal: Principal) -> bool:
        """Whether ``principal`` may open another session here (``MAX_SESSIONS``,
        ``SESSIONS_PER_USER``; checked outside the SDK's lock, so requests opening sessions
        at the same moment may pass these bounds by as many)."""
        owners, owner = self._owners(), authorization_context(_user(principal))
        mine = sum(1 for held in owners.values() if held == owner)
        return len(owners) < MAX_SESSIONS and mine < SESSIONS_PER_USER


def _user(principal: Principal) -> AuthenticatedUser:
    """``principal`` as the SDK names a session's owner (tenant and subject)."""
    return AuthenticatedUser(
        AccessToken(token="", client_id=principal.tenant, scopes=[], subject=principal.sub)
    )


def asks_for_a_session(body: bytes) -> bool:
    """Whether ``body`` is an ``initialize`` of a handshake revision that declares
    elicitation: that client can be asked only through a session."""
    try:
        message = orjson.loads(body)
        method, params = message["method"], message["params"]
        declared, revision = params["capabilities"]["elicitation"], params["protocolVersion"]
    except (ValueError, TypeError, KeyError):  # declares nothing, or the SDK refuses it
        return False
    return (
        method == "initialize"
        and isinstance(declared, dict)
        and isinstance(revision, str)
        and revision in ASKING_REVISIONS
    )


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` for a request whose body was read already: that body, then the rest."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


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
