"""What every request body shares: unknown fields refused, finite numbers, storable text.

Both ways a body is parsed (``deps.read_body`` from the bytes, FastAPI for the other routes)
validate through these types, so a rule here holds on every route. JSON's ``NaN`` and
``Infinity`` tokens, and numbers that overflow a double (``1e400``), are not JSON numbers and
are refused as a malformed body; text that PostgreSQL cannot store (NUL, lone surrogates) is
refused wherever a body field is an id or free text.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from app import recordable


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _storable(value: str) -> str:
    if not recordable.storable(value):
        raise ValueError("text with a NUL or a lone surrogate")
    return value


def _finite(value: Any, depth: int = 0) -> bool:
    """Whether every number in ``value`` is finite, as far as it may nest: what lies deeper
    than ``recordable.MAX_DEPTH`` is refused, and that refusal recorded, by ``policy.prepare``
    (looking into it here would exhaust Python's recursion limit first)."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if depth >= recordable.MAX_DEPTH:
        return True
    if kind is dict:
        return all(_finite(inner, depth + 1) for inner in value.values())
    if kind is list:
        return all(_finite(inner, depth + 1) for inner in value)
    return True


def _finite_object(value: dict[str, Any]) -> dict[str, Any]:
    if not _finite(value):
        raise ValueError("a number that is not finite (NaN, Infinity, or beyond a double)")
    return value


Text = Annotated[str, AfterValidator(_storable)]
"""An id or free text in a body: what PostgreSQL's ``text`` can hold."""
JsonObject = Annotated[dict[str, Any], AfterValidator(_finite_object)]
"""Arbitrary JSON whose numbers are all finite; its texts and integers are checked where
they are decided on (``policy.prepare``), so that refusal is recorded."""
