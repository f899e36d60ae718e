"""``app.canonical`` against the ``rfc8785`` package: the same bytes, the same refusals."""

from __future__ import annotations

import math
import random
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from app.canonical import canonical

# Characters where encoders tend to differ: controls, quote, backslash, slash, DEL, the line
# separators, the last BMP characters (which sort after surrogate pairs in UTF-16) and
# characters outside the BMP.
_AWKWARD = [chr(c) for c in range(0x20)] + list('"\\/\x7f\u2028\u2029\ue000\uffff\U0001f600')
_ASCII_KEYS = list("abcxyzABC_09-")
_ANY_KEYS = [*_ASCII_KEYS, "\u00e9", "\ue000", "\U0001f600", "\uffff"]


def _text(rng: random.Random, alphabet: list[str]) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))


def _float(rng: random.Random) -> float:
    roll = rng.random()
    if roll < 0.3:  # the usual: timings, amounts, scores
        return round(rng.uniform(-1e6, 1e6), rng.randint(0, 8)) * rng.choice([1, 1e-9, 1e12])
    if roll < 0.6:
        return rng.choice(
            [0.0, -0.0, 1.0, -1.5, 1e21, 1e-7, 1e-6, 123e20, 5e-324, 1.7976931348623157e308]
        )
    value: float = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
    return value if math.isfinite(value) else 0.5


def _value(rng: random.Random, keys: list[str], depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.3:
        return {_text(rng, keys): _value(rng, keys, depth + 1) for _ in range(rng.randint(0, 5))}
    if depth < 3 and roll < 0.4:
        return [_value(rng, keys, depth + 1) for _ in range(rng.randint(0, 4))]
    if roll < 0.5:
        return _text(rng, list("abc ") + _AWKWARD)
    if roll < 0.65:
        return rng.choice([rng.randint(-1000, 1000), 2**53 - 1, -(2**53) + 1, 2**40])
    if roll < 0.85:
        return _float(rng)
    return rng.choice([None, True, False])


@pytest.mark.parametrize("keys", [_ASCII_KEYS, _ANY_KEYS], ids=["ascii-keys", "any-keys"])
def test_random_documents_match_rfc8785_byte_for_byte(keys: list[str]) -> None:
    rng = random.Random(8785)
    for _ in range(3000):
        document = _value(rng, keys)
        assert canonical(document) == rfc8785.dumps(document), document


def test_non_ascii_keys_sort_by_utf16_code_units() -> None:
    document = {"\U0001f600": 1, "\uffff": 2, "a": 3}
    assert canonical(document) == '{"a":3,"\U0001f600":1,"\uffff":2}'.encode()


@pytest.mark.parametrize(
    "document",
    [{"n": 2**53}, {"n": math.nan}, {"n": [math.inf]}, {"s": "\ud800"}, {"k": object()}],
    ids=["big-int", "nan", "inf", "lone-surrogate", "object"],
)
def test_what_rfc8785_refuses_is_refused(document: Any) -> None:
    with pytest.raises((rfc8785.CanonicalizationError, TypeError)):
        rfc8785.dumps(document)
    with pytest.raises((rfc8785.CanonicalizationError, TypeError)):
        canonical(document)


def test_sequences_and_subclasses_are_written_as_rfc8785_writes_them() -> None:
    document: dict[str, Any] = {"t": (1, "two"), "b": True, "i": 7}
    assert canonical(document) == rfc8785.dumps(document)


def test_floats_of_every_magnitude_match_rfc8785() -> None:
    rng = random.Random(754)
    for _ in range(20000):
        value = round(rng.uniform(-10, 10), rng.randint(0, 17)) * 10.0 ** rng.randint(-30, 30)
        assert canonical([value]) == rfc8785.dumps([value]), repr(value)


# Any JSON-like document: big and small integers, every float (NaN and infinities too), text
# with control characters and lone surrogates, keys outside ASCII and the BMP.
_ANY_TEXT = st.text(st.characters(exclude_categories=[]), max_size=6)
_DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _ANY_TEXT,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(_ANY_KEYS) | _ANY_TEXT, inner, max_size=4)
    ),
    max_leaves=16,
)


@given(_DOCUMENTS)
@settings(max_examples=200)
def test_generated_documents_are_written_or_refused_exactly_as_rfc8785_does(
    document: Any,
) -> None:
    try:
        expected = rfc8785.dumps(document)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as refusal:
        with pytest.raises(type(refusal)):
            canonical(document)
        return
    assert canonical(document) == expected
