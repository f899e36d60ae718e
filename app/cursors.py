"""Opaque pagination cursors: the sort key of the last item a page showed.

A cursor comes back from the client, so ``decode`` takes nothing on trust: it returns only
values ``encode`` could have written (a 64-bit sequence number written as a JSON number, or
a printable ASCII text such as an id or a timestamp), and anything else is ``invalid_request``,
never a query that fails.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

import orjson

from app.errors import InvalidRequest, ToolgateError

MAX_TEXT = 200
MAX_SEQUENCE = 2**63 - 1


def encode(*values: str | int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(values))).decode().rstrip("=")


def decode(cursor: str, size: int) -> list[str]:
    """The ``size`` values of the cursor, as text; numbers are written as numbers, so a text
    of digits was never written by ``encode``."""
    try:
        values = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise malformed() from None
    if not isinstance(values, list) or len(values) != size:
        raise malformed()
    return [_value(v) for v in values]


def _value(value: object) -> str:
    if type(value) is int and 0 <= value <= MAX_SEQUENCE:
        return str(value)
    if (
        isinstance(value, str)
        and 0 < len(value) <= MAX_TEXT
        and value.isascii()
        and value.isprintable()
        and not value.isdigit()
    ):
        return value
    raise malformed()


def instant(text: str) -> datetime:
    """A cursor's timestamp, which must carry an offset, as a UTC instant: an offset that
    moves it out of the years 1 to 9999 (``0001-01-01T00:00:00+23:59``) was never written
    by ``encode`` either."""
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise malformed() from None
    if stamp.tzinfo is None:
        raise malformed()
    try:
        return stamp.astimezone(UTC)
    except OverflowError:
        raise malformed() from None


def malformed() -> ToolgateError:
    return InvalidRequest("malformed cursor")
