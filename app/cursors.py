"""Opaque pagination cursors: the sort key of the last item a page showed."""

from __future__ import annotations

import base64
import binascii

import orjson

from app.errors import InvalidRequest


def encode(*values: str | int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(values))).decode().rstrip("=")


def decode(cursor: str, size: int) -> list[str]:
    try:
        values = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise InvalidRequest("malformed cursor") from None
    if not isinstance(values, list) or len(values) != size:
        raise InvalidRequest("malformed cursor")
    return [str(v) for v in values]
