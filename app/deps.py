"""Request dependencies: the application state, the verified principal and the body.

``authenticate`` and ``get_state`` take only the request, so a ``DecisionRoute``
(``app.routing``) can call them without FastAPI's dependency solving; ``read_body`` is how it
parses its body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypeVar, cast

from fastapi import Depends, Path, Request
from pydantic import BaseModel, ValidationError

from app import recordable
from app.auth.principal import Principal
from app.bodies import ID_PATTERN
from app.errors import InvalidRequest, ToolgateError, Unauthenticated, Unavailable
from app.state import AppState

Model = TypeVar("Model", bound=BaseModel)


def state_of(request: Request) -> AppState:
    return cast(AppState, request.app.state.toolgate)


async def get_state(request: Request) -> AppState:
    return state_of(request)


async def authenticate(request: Request) -> Principal:
    """The principal from ``Authorization: Bearer <JWT>``; identity comes from nowhere else."""
    return await state_of(request).verifier.verify(bearer_token(request))


def bearer_token(request: Request) -> str:
    """The token of ``Authorization: Bearer <JWT>``, not yet verified. The header must come
    once (RFC 9110 makes it a singleton): with two, a proxy in front that checked one while
    toolgate read the other would let a request act for a principal nobody checked."""
    fields = request.headers.getlist("authorization")
    scheme, _, token = (fields[0] if len(fields) == 1 else "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("a Bearer token is required")
    return token.strip()


async def read_body(request: Request, model: type[Model]) -> Model:
    """The JSON body as ``model`` (an ``app.bodies.Body``), validated by pydantic-core straight
    from the bytes. As FastAPI's strict content type: a body not declared ``application/json``
    (or ``+json``) is refused, not guessed at."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        raise InvalidRequest("the request body must be JSON (Content-Type: application/json)")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise malformed(exc.errors(), skip=0) from None


def malformed(errors: Sequence[Any], skip: int, what: str = "the request body") -> ToolgateError:
    """``invalid_request`` listing each error as a JSON Pointer to the offending field (after
    dropping ``skip`` leading location parts, such as FastAPI's ``"body"``)."""
    return InvalidRequest(
        f"{what} is malformed",
        errors=[
            {
                "path": "/" + "/".join(recordable.text(str(p)) for p in e["loc"][skip:]),
                "message": e["msg"],
            }
            for e in errors
        ],
    )


AUTHENTICATED = (Unauthenticated, Unavailable)
"""The problems any route that authenticates may answer (``app.responses.problems``): no
valid token, or a JWKS that cannot be fetched."""

State = Annotated[AppState, Depends(get_state)]
CurrentPrincipal = Annotated[Principal, Depends(authenticate)]
PathId = Annotated[str, Path(pattern=ID_PATTERN)]
"""An id in the path (``/calls/{call_id}``): malformed is ``invalid_request``, as in a body."""
