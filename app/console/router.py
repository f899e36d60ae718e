"""HTTP for the console: ``/console`` (the approver's inbox), ``/console/calls/{call_id}``
(one call, to decide or to trace), ``/console/audit`` (search, verify, export) and their
assets, all read from files inside the package.

The pages carry no data and need no token: every page is the same file, and the script in it
calls the public API from the browser with the user's own bearer token. So these routes hold
no authority; what they must get right is the page's own safety, in ``HEADERS``: scripts and
styles only from this origin (nothing inline, nothing from elsewhere), requests only to this
origin, and no framing, so another site cannot lay the Approve button under its own page.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

from app.deps import PathId
from app.errors import NotFound

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


def _page() -> Response:
    return Response(_file("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/console")
async def inbox() -> Response:
    return _page()


@router.get("/console/audit")
async def audit() -> Response:
    return _page()


@router.get("/console/calls/{call_id}")
async def call(call_id: PathId) -> Response:
    """The same page: the script reads the call id from the address."""
    return _page()


@router.get("/console/static/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound("no such file")
    return Response(_file(name), media_type=ASSETS[name], headers=HEADERS)
