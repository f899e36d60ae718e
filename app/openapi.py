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
_AS_LINKED = {"x-schemathesis": {"merge_body": False}}
"""A linked request's body is exactly the link's (no generated members merged in), so the
next step runs the call the previous one answered."""
_CALL = "$response.body#/call_id"


def _link(operation: str, description: str, **target: Any) -> dict[str, Any]:
    return {"operationId": operation, "description": description, **target}


LINKS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("/propose", "post"): {
        "DryRun": _link(
            "dry_run", "Preview the proposed call", requestBody={"call_id": _CALL}, **_AS_LINKED
        ),
        "Execute": _link(
            "execute",
            "Run the proposed call by its id (a mutation's key made from the call id)",
            requestBody={"call_id": _CALL},
            parameters={"header.Idempotency-Key": _CALL},
            **_AS_LINKED,
        ),
        "History": _link("call_history", "Read the call", parameters={"path.call_id": _CALL}),
    },
    ("/dry-run", "post"): {
        "Approve": _link(
            "approve",
            "Approve exactly what the preview showed (as one of the call's approvers)",
            requestBody={
                "call_id": _CALL,
                "snapshot_hash": "$response.body#/snapshot_hash",
                "decision": "approve",
            },
            **_AS_LINKED,
        ),
        "Execute": _link(
            "execute",
            "Run the previewed call",
            requestBody={"call_id": _CALL, "dry_run_id": "$response.body#/dry_run_id"},
            parameters={"header.Idempotency-Key": _CALL},
            **_AS_LINKED,
        ),
    },
    ("/approve", "post"): {
        "Execute": _link(
            "execute",
            "Run the approved call under its approval",
            requestBody={"call_id": _CALL, "approval_id": "$response.body#/approval_id"},
            parameters={"header.Idempotency-Key": _CALL},
            **_AS_LINKED,
        ),
        "History": _link(
            "call_history", "Read the decided call", parameters={"path.call_id": _CALL}
        ),
    },
    ("/execute", "post"): {
        "History": _link(
            "call_history", "Read the executed call", parameters={"path.call_id": _CALL}
        ),
    },
    ("/runs", "post"): {
        "Read": _link(
            "read_run", "Read the run", parameters={"path.run_id": "$response.body#/run_id"}
        ),
        "Finish": _link(
            "finish_run", "End the run", parameters={"path.run_id": "$response.body#/run_id"}
        ),
        "Propose": _link(
            "propose", "Propose a call in the run", requestBody={"run_id": "$response.body#/run_id"}
        ),
        "Execute": _link(
            "execute", "Run a call in the run", requestBody={"run_id": "$response.body#/run_id"}
        ),
    },
}
"""How operations connect (OpenAPI links): propose, dry-run, approve and execute by
``call_id``, and a run's id into the calls made in it. A client, or a fuzzer testing
statefully, can follow them from one answer to the next request."""


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
            path = route.path_format
            operation = doc["paths"][path][method.lower()]
            responses = operation["responses"]
            if _VALIDATION in json.dumps(responses.get("422", {})):
                del responses["422"]
            if _authenticates(route.dependant):
                operation["security"] = [{BEARER: []}]
            links = LINKS.get((path, method.lower()))
            if links is not None:
                responses["200"]["links"] = links
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
