"""Request dependencies: the application state and the verified principal."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from app.auth.principal import Principal
from app.errors import Unauthenticated
from app.state import AppState


async def get_state(request: Request) -> AppState:
    return cast(AppState, request.app.state.toolgate)


async def authenticate(request: Request) -> Principal:
    """The principal from ``Authorization: Bearer <JWT>``; identity comes from nowhere else."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("a Bearer token is required")
    principal = await cast(AppState, request.app.state.toolgate).verifier.verify(token.strip())
    request.state.principal = principal
    return principal


State = Annotated[AppState, Depends(get_state)]
CurrentPrincipal = Annotated[Principal, Depends(authenticate)]
