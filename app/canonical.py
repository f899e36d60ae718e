"""Content digests: ``"sha256:" + hex(sha256(RFC 8785 canonical JSON))``.

One definition for fingerprints, snapshot hashes and audit row hashes, so that key order and
whitespace never change any of them.

``canonical`` gives exactly the bytes of the ``rfc8785`` package, several times faster: orjson
writes what it writes identically to RFC 8785 (sorted ASCII keys, strings, safe integers,
literals), each float's text is embedded as a fragment (``_number``), and any
document holding something else (a non-ASCII key, whose UTF-16 order may differ from orjson's,
an integer beyond 2**53, a tuple, ...) goes to ``rfc8785`` whole, which also raises
what it raises. ``tests/test_canonical.py`` compares the two on random documents.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import rfc8785

SAFE_INTEGER = 2**53 - 1
"""I-JSON: beyond this, parsers that read numbers as doubles see another number."""


class _Unusual(Exception):
    """The document holds something only ``rfc8785`` writes right."""


def _prepared(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is dict:
        prepared = {}
        for key, inner in value.items():
            if type(key) is not str or not key.isascii():
                raise _Unusual
            prepared[key] = _prepared(inner)
        return prepared
    if kind is list:
        return [_prepared(inner) for inner in value]
    if kind is int and -SAFE_INTEGER <= value <= SAFE_INTEGER:
        return value
    if kind is float:
        return orjson.Fragment(_number(value))
    raise _Unusual


def _number(value: float) -> bytes:
    """A float as RFC 8785 writes it. Python's ``repr`` gives the same shortest round-trip
    digits; it differs only in exponent notation and a trailing ``.0``, left to ``rfc8785``."""
    text = repr(value)
    if "e" in text or text.endswith(".0") or text in ("nan", "inf", "-inf"):
        return rfc8785.dumps(value)
    return text.encode()


def canonical(document: Any) -> bytes:
    """RFC 8785 canonical JSON. Raises ``rfc8785.CanonicalizationError`` for what JSON cannot
    say exactly (also for a string that is not valid Unicode)."""
    try:
        prepared = _prepared(document)
    except _Unusual:
        return rfc8785.dumps(document)
    try:
        return orjson.dumps(prepared, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return rfc8785.dumps(document)


def digest(document: Any) -> str:
    """Raises ``rfc8785.CanonicalizationError`` for what JSON cannot say exactly."""
    return "sha256:" + hashlib.sha256(canonical(document)).hexdigest()
