"""``recordable``: what fits is named exactly, and the recorded form of anything fits."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.canonical import SAFE_INTEGER, canonical
from app.recordable import MAX_DEPTH, problems, recorded, storable

texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=8) | st.sampled_from(
    ["\x00", "a\x00", "\ud800", "x\udfff", "\\u0000"]
)
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, derandomize=True, database=None)
@given(values)
def test_the_recorded_form_of_any_value_fits_everywhere_it_is_written(value: Any) -> None:
    form = recorded(value)
    assert problems(form) == []
    canonical(form)  # RFC 8785: fingerprints and audit hashes
    text = orjson.dumps(form)  # asyncpg's jsonb codec, both ways
    assert orjson.loads(text) == form


@settings(max_examples=300, derandomize=True, database=None)
@given(values)
def test_a_value_that_fits_is_recorded_unchanged(value: Any) -> None:
    if not problems(value):
        assert recorded(value) == value or _has_nan(value)


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    return isinstance(value, list) and any(_has_nan(v) for v in value)


@pytest.mark.parametrize("number", [0, SAFE_INTEGER, -SAFE_INTEGER, 1.5e308, -0.0])
def test_numbers_within_i_json_fit(number: float) -> None:
    assert problems({"n": number}) == []


@pytest.mark.parametrize(
    ("number", "form"),
    [
        (SAFE_INTEGER + 1, str(SAFE_INTEGER + 1)),
        (-SAFE_INTEGER - 1, str(-SAFE_INTEGER - 1)),
        (10**400, "1" + "0" * 400),
        (math.inf, "inf"),
        (math.nan, "nan"),
    ],
)
def test_numbers_beyond_i_json_are_named_and_recorded_as_text(number: float, form: str) -> None:
    assert [p["path"] for p in problems({"n": [number]})] == ["/n/0"]
    assert recorded({"n": [number]}) == {"n": [form]}


def test_unstorable_texts_and_keys_are_named_and_recorded_escaped() -> None:
    value = {"a\x00": "b", "c": ["\ud800x", "fine", "é"]}
    assert problems(value) == [
        {"path": "/a\\u0000", "message": "a key with a NUL or a lone surrogate"},
        {"path": "/c/0", "message": "text with a NUL or a lone surrogate"},
    ]
    assert recorded(value) == {"a\\u0000": "b", "c": ["\\ud800x", "fine", "é"]}


def test_storable_text_is_valid_unicode_without_nul() -> None:
    assert [storable(t) for t in ("plain", "é\U0001f600", "")] == [True] * 3
    assert [storable(t) for t in ("\x00", "é\ud800", "\udfff")] == [False] * 3


def nested(depth: int) -> Any:
    """An array ``depth`` levels deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_value_nested_past_the_limit_is_named_and_recorded_cut_short() -> None:
    """orjson writes and the schema validator reads only about 254 levels; an MCP request's
    JSON may nest a thousand, and Python could not even walk that far to check it."""
    assert problems({"a": nested(MAX_DEPTH - 1)}) == []
    assert [p["path"] for p in problems({"a": nested(MAX_DEPTH)})] == [
        "/a" + "/0" * (MAX_DEPTH - 1)
    ]
    form = recorded({"a": nested(5_000)})
    assert problems(form) == []
    assert orjson.loads(orjson.dumps(form)) == form
    canonical(form)
    assert problems(nested(5_000))
