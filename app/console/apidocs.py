"""``/docs``: the API reference, Swagger UI over ``/openapi.json``, served from the package.

Swagger UI's script and stylesheet come from the ``fastapi-swagger`` wheel, which carries
them, and the page and its start-up script from ``static/``: nothing is fetched from a CDN or
any other origin, and the page's policy (``HEADERS``) would refuse it. Swagger UI sets inline
styles and data: images, so those are allowed here, unlike on the console's pages; scripts
still come only from this origin and nothing inline runs.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import fastapi_swagger.resources
from fastapi import APIRouter
from fastapi.responses import Response

from app.console.router import HEADERS, STATIC
from app.errors import NotFound

router = APIRouter(include_in_schema=False)

SWAGGER = files(fastapi_swagger.resources)
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
OURS = {"docs.js": "text/javascript; charset=utf-8"}
DOCS_HEADERS = {
    **HEADERS,
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline';"
        " img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none';"
        " frame-ancestors 'none'"
    ),
    "Cache-Control": "no-cache",
}


@cache
def _asset(name: str) -> bytes:
    if name in OURS:
        return (STATIC / name).read_bytes()
    return SWAGGER.joinpath(name).read_bytes()


@router.get("/docs")
async def docs() -> Response:
    return Response(
        (STATIC / "docs.html").read_bytes(),
        media_type="text/html; charset=utf-8",
        headers=DOCS_HEADERS,
    )


@router.get("/docs/{name}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name) or OURS.get(name)
    if media_type is None:
        raise NotFound("no such file")
    return Response(_asset(name), media_type=media_type, headers=DOCS_HEADERS)
