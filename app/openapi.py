"""The OpenAPI 3.1 document of the API, served at ``/openapi.json`` and shown at ``/docs``.

FastAPI describes each route from its signature, ``response_model`` and ``responses``
(``app.responses.problems``). This adds what it cannot know: the ``bearerAuth`` (JWT)
scheme on every operation that authenticates, the ``Problem`` schema the error answers
refer to, and no ``422`` validation answer of FastAPI's own (a malformed request is a 400
``invalid_request`` problem here).

``python -m app.openapi`` prints the document; ``docs/openapi.json`` is that output, and a
test fails when it is stale, so a change to the contract is always a deliberate one.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, iter_route_contexts

from app.deps import authenticate
from app.responses import Problem

BEARER = "bearerAuth"
DESCRIPTION = (
    "Authorization for LLM-agent tool calls: a model proposes a call, policy decides, a"
    " human approves what a dry-run showed, and toolgate runs it exactly once. Every"
    " endpoint but the health checks and metrics needs `Authorization: Bearer <JWT>`;"
    " every error is an RFC 9457 problem (`application/problem+json`) with a stable `code`."
)
_VALIDATION = "#/components/schemas/HTTPValidationError"


def document(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(
        title=app.title,
        version=version("toolgate"),
        openapi_version="3.1.0",
        description=DESCRIPTION,
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Problem"] = Problem.model_json_schema()
    components["securitySchemes"] = {
        BEARER: {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
    }
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        for method in route.methods or ():
            operation = doc["paths"][context.path][method.lower()]
            responses = operation["responses"]
            if _VALIDATION in json.dumps(responses.get("422", {})):
                del responses["422"]
            if _authenticates(route.dependant):
                operation["security"] = [{BEARER: []}]
    return doc


def _authenticates(dependant: Dependant) -> bool:
    return any(d.call is authenticate or _authenticates(d) for d in dependant.dependencies)


def text(doc: dict[str, Any]) -> str:
    """The document as committed: sorted keys, two-space indents, a final newline."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    # Imported here: the application itself imports this module to serve the document.
    from app.main import create_app
    from app.settings import Settings

    sys.stdout.write(text(create_app(Settings.from_env({})).openapi()))


if __name__ == "__main__":
    main()
