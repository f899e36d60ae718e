"""JSON responses rendered with orjson, and RFC 9457 problem responses."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse

from app.errors import ToolgateError


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=str)


def problem(error: ToolgateError, headers: dict[str, str] | None = None) -> JSON:
    if error.status == 401:
        headers = {"WWW-Authenticate": "Bearer", **(headers or {})}
    return JSON(
        error.problem(),
        status_code=error.status,
        headers=headers,
        media_type="application/problem+json",
    )
