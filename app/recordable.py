"""Raw JSON input as toolgate can record it.

Every decision is stored, and hashed into the audit chain, so what a request says must fit
where it is written: PostgreSQL ``text`` and ``jsonb`` cannot hold NUL; asyncpg's ``jsonb``
codec reads integers only up to 64 bits; RFC 8785 (fingerprints, audit hashes) takes integers
within I-JSON's ±(2**53-1), finite doubles and valid Unicode only; orjson (the ``jsonb``
codec) writes, and the schema validator reads, no more than about 254 levels of nesting.

``problems`` names what in a value does not fit, so the request can be refused for it;
``recorded`` is the form in which such a value is still stored when the refusal itself is
recorded: it always fits, and it is the value unchanged whenever the value already fits.
"""

from __future__ import annotations

import math
from typing import Any

from app.canonical import SAFE_INTEGER

MAX_DEPTH = 200
"""How many levels of objects and arrays a value may nest. As deep as a REST body can nest
arguments (its JSON parser stops at about 200 levels), well within what orjson writes and
the schema validator reads; an MCP request's JSON is parsed deeper, so it is judged here."""
DEEPER = f"[nested deeper than {MAX_DEPTH} levels]"


def storable(text: str) -> bool:
    """No NUL and no lone surrogate (which UTF-8 cannot encode)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text(value: str) -> str:
    """``value`` with NUL written as ``\\u0000`` and lone surrogates as ``\\udXXX``; an
    escaped text reads like the JSON that carried it, and may coincide with a text that
    spelled the escape out."""
    if storable(value):
        return value
    return value.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")


def recorded(value: Any, depth: int = 0) -> Any:
    """Any JSON value in a form that can be stored and canonicalized: texts as ``text``,
    integers beyond ±(2**53-1) and non-finite numbers as their decimal text, and an object
    or array nested past ``MAX_DEPTH`` as the text ``DEEPER``."""
    kind = type(value)
    if kind in (dict, list) and depth >= MAX_DEPTH:
        return DEEPER
    if kind is str:
        return text(value)
    if kind is int:
        return value if -SAFE_INTEGER <= value <= SAFE_INTEGER else str(value)
    if kind is float:
        return value if math.isfinite(value) else repr(value)
    if kind is dict:
        return {text(key): recorded(inner, depth + 1) for key, inner in value.items()}
    if kind is list:
        return [recorded(inner, depth + 1) for inner in value]
    return value


def problems(value: Any, path: str = "") -> list[dict[str, str]]:
    """Each place in ``value`` that does not fit, as ``{"path": JSON Pointer, "message"}``."""
    found: list[dict[str, str]] = []
    _check(value, path, found, 0)
    return found


def _check(value: Any, path: str, found: list[dict[str, str]], depth: int) -> None:
    kind = type(value)
    if kind in (dict, list) and depth >= MAX_DEPTH:
        found.append({"path": path, "message": f"nested deeper than {MAX_DEPTH} levels"})
    elif kind is str:
        if not storable(value):
            found.append({"path": path, "message": "text with a NUL or a lone surrogate"})
    elif kind is int:
        if not -SAFE_INTEGER <= value <= SAFE_INTEGER:
            found.append({"path": path, "message": "an integer beyond ±(2**53-1)"})
    elif kind is float:
        if not math.isfinite(value):
            found.append({"path": path, "message": "a number that is not finite"})
    elif kind is dict:
        for key, inner in value.items():
            at = f"{path}/{text(key)}"
            if not storable(key):
                found.append({"path": at, "message": "a key with a NUL or a lone surrogate"})
            _check(inner, at, found, depth + 1)
    elif kind is list:
        for index, inner in enumerate(value):
            _check(inner, f"{path}/{index}", found, depth + 1)
