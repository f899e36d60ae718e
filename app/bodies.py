"""What every request body shares: unknown fields refused, finite numbers, storable text.

Both ways a body is parsed (``deps.read_body`` from the bytes, FastAPI for the other routes)
validate through these types, so a rule here holds on every route. JSON's ``NaN`` and
``Infinity`` tokens, and numbers that overflow a double (``1e400``), are not JSON numbers and
are refused as a malformed body; text that PostgreSQL cannot store (NUL, lone surrogates) is
refused wherever a body field is an id or free text.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, TypeGuard

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

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
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,200}$"
_ID = re.compile(ID_PATTERN)
Id = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
"""An identifier a request names (a call, run, approval or dry-run id, a tool call id): 1 to
200 characters of ``[A-Za-z0-9_.:-]``, which every id toolgate issues is. Present means
present: an empty or blank id is refused as malformed, never read as "none given", since
leaving out ``run_id`` would take a call out of its run's budget and provenance. A
well-formed id that names nothing the caller may see is ``not_found`` where it is looked
up."""


def is_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` is an ``Id``, for input that no body model reads first."""
    return isinstance(value, str) and _ID.match(value) is not None


JsonObject = Annotated[dict[str, Any], AfterValidator(_finite_object)]
"""Arbitrary JSON whose numbers are all finite; its texts and integers are checked where
they are decided on (``policy.prepare``), so that refusal is recorded."""
