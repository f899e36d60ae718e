"""Cross-origin access for consoles hosted elsewhere (``TOOLGATE_CORS_ORIGINS``).

Only the exact origins configured may call the API from a browser, and only with a bearer
token in the ``Authorization`` header: no cookies or other credentials are allowed, since
toolgate never authenticates by them. A refused preflight is a problem like every other
refusal, and carries no ``Access-Control-Allow-*`` header, so the browser sends nothing.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from app.errors import InvalidRequest
from app.responses import problem

METHODS = ("GET", "POST")
HEADERS = ("authorization", "content-type", "idempotency-key")
EXPOSED = ("idempotent-replayed", "www-authenticate")


def error_headers(origins: tuple[str, ...], origin: str | None) -> dict[str, str]:
    """The cross-origin headers of a 500 problem: Starlette's error layer renders it, and
    that layer wraps every middleware, this one included. Without them a console hosted
    elsewhere could not read the problem (``internal_error``)."""
    if origin is None or origin not in origins:
        return {}
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": ", ".join(EXPOSED),
        "Vary": "Origin",
    }


class CrossOrigin(CORSMiddleware):
    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        super().__init__(
            app,
            allow_origins=origins,
            allow_methods=METHODS,
            allow_headers=HEADERS,
            expose_headers=EXPOSED,
            allow_credentials=False,
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        answer = super().preflight_response(request_headers)
        if answer.status_code == 200:
            return answer
        refused = bytes(answer.body).decode().removeprefix("Disallowed CORS ")
        return problem(InvalidRequest(f"cross-origin request refused (its {refused})"))
