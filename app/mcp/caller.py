"""Who sends an MCP request: verified by the endpoint (``router.Endpoint``) before the SDK
sees the request, and handed to the handlers in the request's ASGI scope."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from app.auth.principal import Principal
from app.state import AppState

SCOPE_KEY = "toolgate.mcp.caller"


@dataclass(frozen=True)
class Caller:
    state: AppState
    principal: Principal
    session: str
    """The MCP session toolgate names requests by: the token's ``sid`` claim, or a digest of
    the token itself (``calls.request_key``)."""
    base_url: str
    """Where this request reached toolgate, for links back to it (the console)."""

    @classmethod
    def verified(cls, state: AppState, principal: Principal, token: str, base_url: str) -> Caller:
        session = principal.session_id or hashlib.sha256(token.encode()).hexdigest()
        return cls(state, principal, session, base_url)

    @staticmethod
    def of(request: Any) -> Caller:
        """The caller the endpoint put in the scope of ``request`` (the SDK's HTTP request);
        its absence is a wiring fault, never an anonymous caller."""
        caller = request.scope.get(SCOPE_KEY) if request is not None else None
        if not isinstance(caller, Caller):
            raise RuntimeError("an MCP request reached a handler without a verified caller")
        return caller
