"""HTTP for the console: ``/console`` (the approver's inbox), ``/console/calls/{call_id}``
(one call, to decide or to trace), ``/console/audit`` (search, verify, export),
``/console/callback`` (where the OpenID provider sends a signed-in approver back), and
their assets, all read from files inside the package; ``/console/config`` tells the script
how to sign someone in.

The pages carry no data and need no token: every page is the same file, and the script in it
calls the public API from the browser with the user's own bearer token. So these routes hold
no authority; what they must get right is the page's own safety, in ``HEADERS``: scripts and
styles only from this origin (nothing inline, nothing from elsewhere), requests only to this
origin (and, with sign-in, the provider's token endpoint), and no framing, so another site
cannot lay the Approve button under its own page.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import orjson
from fastapi import APIRouter
from fastapi.responses import Response

from app.deps import PathId, State
from app.errors import NotFound, Unavailable
from app.state import AppState

router = APIRouter(include_in_schema=False)

STATIC = Path(__file__).parent / "static"
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@cache
def _file(name: str) -> bytes:
    return (STATIC / name).read_bytes()


async def _page(state: AppState) -> Response:
    """The page; with sign-in, allowed to redeem a code at the provider's token endpoint
    (when the provider cannot be read, the page still loads, and says sign-in is down)."""
    headers = HEADERS
    try:
        provider = await state.discovery.provider()
    except Unavailable:
        provider = None
    if provider is not None:
        policy = HEADERS["Content-Security-Policy"].replace(
            "connect-src 'self'", f"connect-src 'self' {provider.token_origin}"
        )
        headers = {**HEADERS, "Content-Security-Policy": policy}
    return Response(_file("index.html"), media_type="text/html; charset=utf-8", headers=headers)


@router.get("/console")
async def inbox(state: State) -> Response:
    return await _page(state)


@router.get("/console/audit")
async def audit(state: State) -> Response:
    return await _page(state)


@router.get("/console/calls/{call_id}")
async def call(state: State, call_id: PathId) -> Response:
    """The same page: the script reads the call id from the address."""
    return await _page(state)


@router.get("/console/callback")
async def callback(state: State) -> Response:
    """The same page, where the provider sends the approver back with a code; the script
    redeems it and goes back to the page the approver signed in from."""
    return await _page(state)


@router.get("/console/config")
async def config(state: State) -> Response:
    """How the script signs someone in: ``{"oidc": null}`` (a token is pasted or given in
    the address), or the provider's issuer, the console's client id and the two endpoints
    of the authorization-code flow. ``503`` while the provider cannot be read."""
    provider = await state.discovery.provider()
    body = {"oidc": provider._asdict() if provider is not None else None}
    return Response(orjson.dumps(body), media_type="application/json", headers=HEADERS)


@router.get("/console/static/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound("no such file")
    return Response(_file(name), media_type=ASSETS[name], headers=HEADERS)
