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


def as_written(value: Any) -> Any:
    """``value`` as its canonical JSON reads back: a float of integral value within
    ±(2**53-1) (``1.0``, ``-0.0``) is that integer, as RFC 8785 writes it (``1``, ``0``).
    Two values with one digest are then one value everywhere else too: in a URL, where
    ``1.0`` is not ``1``, and in CEL, where ``/`` divides integers apart from doubles."""
    kind = type(value)
    if kind is float and value.is_integer() and abs(value) <= SAFE_INTEGER:
        return int(value)
    if kind is dict:
        return {key: as_written(inner) for key, inner in value.items()}
    if kind is list:
        return [as_written(inner) for inner in value]
    return value


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
