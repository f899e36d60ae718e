"""JSON responses rendered with orjson, RFC 9457 problem responses, and how the OpenAPI
document describes those problems (``Problem``, ``problems``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

import orjson
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from app.errors import InvalidRequest, ToolgateError

PROBLEM_JSON = "application/problem+json"
CLIENT_GONE = 499
"""The status recorded (in metrics and the request span; nobody receives it) for a request
whose client left before it was answered: not a server error, and nothing to answer."""


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=str)


def problem(error: ToolgateError, headers: dict[str, str] | None = None) -> JSON:
    if error.status == 401:
        headers = {"WWW-Authenticate": "Bearer", **(headers or {})}
    return JSON(error.problem(), status_code=error.status, headers=headers, media_type=PROBLEM_JSON)


class Problem(BaseModel):
    """An RFC 9457 problem. ``code`` is the stable, machine-readable part; ``detail`` is for
    people. Some problems carry more members (``call_id``, ``errors``, ``mismatch``,
    ``operation_id``, ``run_id``, ...): docs/api.md lists them."""

    model_config = ConfigDict(extra="allow")

    type: str
    """``urn:toolgate:error:<code>``."""
    title: str
    status: int | Literal["unknown"]
    """The HTTP status; ``"unknown"`` (the call's outcome) on a 504 from ``/execute``."""
    detail: str
    code: str
    call_id: str | None = None


def problems(*errors: type[ToolgateError]) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses`` for the problems a route answers, by status, each listing its
    ``code`` values. Every route may also answer ``invalid_request`` (400: a malformed query
    or body) and ``internal_error`` (500), so those are always included."""
    by_status: dict[int, list[type[ToolgateError]]] = defaultdict(list)
    every: tuple[type[ToolgateError], ...] = (InvalidRequest, *errors, ToolgateError)
    for error in every:
        if error not in by_status[error.status]:
            by_status[error.status].append(error)
    return {status: _response(by_status[status]) for status in sorted(by_status)}


def _response(errors: list[type[ToolgateError]]) -> dict[str, Any]:
    codes = sorted({error.code for error in errors})
    schema = {
        "allOf": [
            {"$ref": "#/components/schemas/Problem"},
            {"properties": {"code": {"enum": codes}}},
        ]
    }
    titles = "; ".join(sorted({f"`{e.code}`: {e.title}" for e in errors}))
    return {"description": titles, "content": {PROBLEM_JSON: {"schema": schema}}}
