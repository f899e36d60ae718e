"""Properties of the pure parts over generated input (Hypothesis): argument preparation and
fingerprints, result trimming, and the audit chain's sealing plan and verification walk.
No I/O. Examples are derandomized (the profile in ``conftest.py``): CI runs the same ones.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from app.audit.chain import GENESIS, Plan, Walk, check, check_end, plan
from app.audit.models import AuditRow, ChainHead
from app.calls import policy
from app.calls.results import REDACTED, minimize
from app.canonical import SAFE_INTEGER
from app.catalog.loader import load
from app.catalog.models import Tool
from tests.catalogs import BASE, write

# --- argument preparation and fingerprints -------------------------------------------------

FIND_ORDERS = """
  find_orders:
    mutation: false
    provider: billing
    execute: {method: GET, path: /orders}
    parameters:
      type: object
      additionalProperties: false
      required: [query]
      properties:
        query: {type: string}
        order_id: {type: string, x-resource: order}
        limit: {type: integer, minimum: 1, maximum: 100, default: 20}
        min_amount: {type: number}
        filters:
          type: object
          additionalProperties: false
          default: {}
          properties:
            status: {type: string, enum: [open, shipped], default: open}
            tags: {type: array, items: {type: string}}
        labels:
          type: object
          additionalProperties: {type: [string, integer, boolean, "null"]}
"""
"""A tool with defaults at two levels, a resource, numbers and free-form keys."""


@pytest.fixture(scope="module")
def find_orders(tmp_path_factory: pytest.TempPathFactory) -> Tool:
    catalog = load(write(tmp_path_factory.mktemp("catalog"), BASE + FIND_ORDERS), {})
    return catalog.tools["find_orders"]


TEXT = st.text(st.characters(exclude_categories=["Cs", "Cc"]), max_size=12)
"""Recordable text: no NUL, no lone surrogate (``recordable`` refuses those first)."""
ORDER_IDS = st.from_regex(r"\Aord_[A-Za-z0-9_.-]{1,8}\Z")
"""Ids that can fill the owner lookup's path segment (``policy`` refuses others)."""
SCALARS = st.none() | st.booleans() | st.integers(-SAFE_INTEGER, SAFE_INTEGER) | TEXT

ARGUMENTS = st.fixed_dictionaries(
    {"query": TEXT},
    optional={
        "order_id": ORDER_IDS,
        "limit": st.integers(1, 100),
        "min_amount": st.floats(allow_nan=False, allow_infinity=False),
        "filters": st.fixed_dictionaries(
            {},
            optional={
                "status": st.sampled_from(["open", "shipped"]),
                "tags": st.lists(TEXT, max_size=3),
            },
        ),
        "labels": st.dictionaries(TEXT, SCALARS, max_size=5),
    },
)
"""Arguments the tool accepts, each optional one present or not."""


def reordered(value: Any, data: st.DataObject) -> Any:
    """``value`` with the keys of every object in another order."""
    if isinstance(value, dict):
        keys = data.draw(st.permutations(list(value)))
        return {key: reordered(value[key], data) for key in keys}
    if isinstance(value, list):
        return [reordered(item, data) for item in value]
    return value


@given(raw=ARGUMENTS)
def test_every_default_is_filled_and_every_given_argument_kept(
    find_orders: Tool, raw: dict[str, Any]
) -> None:
    before = copy.deepcopy(raw)
    call = policy.prepare(find_orders, raw)
    assert raw == before, "the caller's arguments were changed"
    given_filters = raw.get("filters", {})
    assert call.arguments == {
        **raw,
        "limit": raw.get("limit", 20),
        "filters": {**given_filters, "status": given_filters.get("status", "open")},
    }
    order_id = raw.get("order_id")
    assert call.target == (None if order_id is None else policy.Target("order", order_id))


@given(raw=ARGUMENTS)
def test_preparing_prepared_arguments_changes_nothing(
    find_orders: Tool, raw: dict[str, Any]
) -> None:
    call = policy.prepare(find_orders, raw)
    again = policy.prepare(find_orders, call.arguments)
    assert (again.arguments, again.fingerprint, again.target) == (
        call.arguments,
        call.fingerprint,
        call.target,
    )


@given(raw=ARGUMENTS, data=st.data())
def test_the_fingerprint_does_not_depend_on_key_order(
    find_orders: Tool, raw: dict[str, Any], data: st.DataObject
) -> None:
    shuffled = reordered(raw, data)
    assert policy.prepare(find_orders, shuffled).fingerprint == (
        policy.prepare(find_orders, raw).fingerprint
    )


def changes(raw: dict[str, Any]) -> st.SearchStrategy[tuple[str, Any]]:
    """(argument, new value): a present argument given another value the tool accepts, or
    an absent optional one given a value other than its default. Values equal in Python
    (``0.0 == -0.0``, ``{"k": 1} == {"k": True}``) are not counted as changes."""

    def differs(name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[str, Any]]:
        return values.filter(lambda new: name not in raw or new != raw[name]).map(
            lambda new: (name, new)
        )

    return st.one_of(
        differs("query", TEXT),
        differs("order_id", ORDER_IDS),
        differs("limit", st.integers(1, 100).filter(lambda n: n != 20 or "limit" in raw)),
        differs("min_amount", st.floats(allow_nan=False, allow_infinity=False)),
        differs("labels", st.dictionaries(TEXT, SCALARS, min_size=1, max_size=3)),
    )


@given(raw=ARGUMENTS, data=st.data())
def test_the_fingerprint_changes_when_any_argument_does(
    find_orders: Tool, raw: dict[str, Any], data: st.DataObject
) -> None:
    name, value = data.draw(changes(raw))
    original = policy.prepare(find_orders, raw)
    altered = policy.prepare(find_orders, {**raw, name: value})
    assert altered.fingerprint != original.fingerprint


# --- result trimming -----------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c"])
"""Few keys, so that listed paths meet the body's."""
BODIES = st.recursive(
    SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)
PATHS = st.lists(KEYS, min_size=1, max_size=3).map(".".join)


def key_paths(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every path to a member of an object in ``node``, lists walked element-wise."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key)
            yield from key_paths(value, (*path, key))
    elif isinstance(node, list):
        for item in node:
            yield from key_paths(item, path)


@st.composite
def trimmings(draw: st.DrawFn) -> tuple[Any, list[str] | None, list[str]]:
    """A body, the fields kept (``None``: all) and the paths redacted, most of them paths
    the body has, so that what is kept or masked is often an object or a list."""
    body = draw(BODIES)
    present = sorted({".".join(path) for path in key_paths(body)})
    paths = st.sampled_from(present) | PATHS if present else PATHS
    fields = draw(st.none() | st.lists(paths, max_size=4))
    return body, fields, draw(st.lists(paths, max_size=4))


def leaves(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every non-container value; lists are walked element-wise, so
    their indexes are not part of the path (as in a listed field path)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list):
        for item in node:
            yield from leaves(item, path)
    else:
        yield path, node


def values_at(node: Any, path: tuple[str, ...]) -> list[Any]:
    """Every value found at ``path``, walking lists on the way element-wise."""
    if not path:
        return [node]
    if isinstance(node, list):
        return [found for item in node for found in values_at(item, path)]
    if isinstance(node, dict) and path[0] in node:
        return values_at(node[path[0]], path[1:])
    return []


def emptied(node: Any) -> None:
    """Clear every list and object in ``node``, innermost first."""
    if isinstance(node, dict | list):
        for inner in list(node.values() if isinstance(node, dict) else node):
            emptied(inner)
        node.clear()


def related(path: tuple[str, ...], listed: tuple[str, ...]) -> bool:
    """``path`` leads to ``listed``, is it, or lies inside it."""
    shorter = min(len(path), len(listed))
    return path[:shorter] == listed[:shorter]


@given(trimmings())
def test_trimming_never_changes_the_providers_body(
    case: tuple[Any, list[str] | None, list[str]],
) -> None:
    body, fields, redact = case
    before = copy.deepcopy(body)
    kept = minimize(body, fields, redact)
    assert body == before
    emptied(kept)
    assert body == before, "the result shares a list or an object with the body"


@given(trimmings())
def test_only_listed_paths_are_kept_and_they_are_kept_whole(
    case: tuple[Any, list[str] | None, list[str]],
) -> None:
    body, fields, _ = case
    fields = fields or []
    kept = minimize(body, fields, [])
    listed = [tuple(field.split(".")) for field in fields]
    for path, value in leaves(kept):
        placeholder = path == () and value is None  # a body that is no object keeps nothing
        assert placeholder or any(related(path, field) for field in listed), path
    for field in listed:
        if values_at(body, field):
            assert values_at(kept, field) == values_at(body, field)


@given(trimmings())
def test_redacted_paths_are_masked_and_nothing_else_changes(
    case: tuple[Any, list[str] | None, list[str]],
) -> None:
    body, fields, redact = case
    plain = minimize(body, fields, [])
    masked = minimize(body, fields, redact)
    hidden = [tuple(path.split(".")) for path in redact]

    def under(path: tuple[str, ...]) -> bool:
        return any(path[: len(h)] == h for h in hidden)

    assert [leaf for leaf in leaves(masked) if not under(leaf[0])] == [
        leaf for leaf in leaves(plain) if not under(leaf[0])
    ]
    for path, value in leaves(masked):
        if under(path):
            assert path in hidden
            assert value == REDACTED
    for path in hidden:
        if values_at(plain, path) and not any(under(path[:n]) for n in range(len(path))):
            assert values_at(masked, path) == [REDACTED] * len(values_at(plain, path))


# --- the audit chain's sealing plan and verification ---------------------------------------

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
GRACE = timedelta(seconds=5)


def audit_row(seq: int, age_s: float, reason: str, amount: float) -> AuditRow:
    return AuditRow(
        seq=seq,
        at=NOW - timedelta(seconds=age_s),
        event="executed",
        tenant="acme",
        actor="alice",
        call_id=f"call_{seq}",
        run_id=None,
        tool="issue_refund",
        target={"type": "order", "id": "ord_1"},
        fingerprint="sha256:ab",
        arguments={"order_id": "ord_1", "amount": amount},
        decision="allow",
        code=None,
        reason=reason,
        policy_version="v1#abc",
        approval_id=None,
        proposed_by="model",
        authorized_by={
            "kind": "policy",
            "sub": "alice",
            "tenant": "acme",
            "policy_version": "v1#abc",
        },
        outcome={"status": "succeeded"},
        total_ms=amount,
        provider_ms=None,
    )


@st.composite
def pending(draw: st.DrawFn) -> tuple[ChainHead, list[AuditRow]]:
    """A chain head and the committed, unsealed rows a sealing pass reads (in seq order):
    late rows at or below ``sealed_through``, then seqs above it with holes, each row young
    or past the grace period."""
    chain_pos = draw(st.integers(0, 50))
    through = draw(st.integers(chain_pos, chain_pos + 20))
    head = ChainHead(chain_pos, draw(st.sampled_from([GENESIS, "sha256:" + "1" * 64])), through)
    late = draw(st.sets(st.integers(1, through), max_size=3)) if through else set()
    ahead = draw(st.sets(st.integers(through + 1, through + 15), max_size=8))
    rows = [
        audit_row(
            seq,
            draw(st.sampled_from([0.0, 1.0, 4.9, 5.0, 60.0])),
            draw(TEXT),
            draw(st.floats(0, 1e6)),
        )
        for seq in sorted(late | ahead)
    ]
    return head, rows


def sealed(rows: list[AuditRow], result: Plan) -> list[AuditRow]:
    """The rows as they stand once the plan's seals are written, in chain order."""
    by_seq = {row.seq: row for row in rows}
    return [
        dataclasses.replace(
            by_seq[seal.seq], chain_pos=seal.chain_pos, prev_hash=seal.prev_hash, hash=seal.hash
        )
        for seal in result.seals
    ]


@given(pending())
def test_a_plan_seals_a_contiguous_chain_and_passes_over_only_old_gaps(
    case: tuple[ChainHead, list[AuditRow]],
) -> None:
    head, rows = case
    result = plan(head, rows, NOW, GRACE)

    positions = [seal.chain_pos for seal in result.seals]
    assert positions == list(range(head.chain_pos + 1, head.chain_pos + 1 + len(positions)))
    links = [head.hash] + [seal.hash for seal in result.seals]
    assert [seal.prev_hash for seal in result.seals] == links[:-1]
    assert result.head.chain_pos == head.chain_pos + len(result.seals)
    assert result.head.hash == links[-1]
    assert result.head.sealed_through >= head.sealed_through

    assert [seal.seq for seal in result.seals] == [row.seq for row in rows[: len(result.seals)]]
    if len(result.seals) < len(rows):
        stopped = rows[len(result.seals)]
        assert result.waiting
        assert stopped.seq > result.head.sealed_through + 1
        assert NOW - stopped.at < GRACE
    else:
        assert not result.waiting

    ahead = {seal.seq for seal in result.seals if seal.seq > head.sealed_through}
    skipped: set[int] = set()
    after = {row.seq: row for row in rows}
    for gap in result.gaps:
        following = after[gap.last_seq + 1]
        assert NOW - following.at >= GRACE, "a gap was passed over within the grace period"
        skipped |= set(range(gap.first_seq, gap.last_seq + 1))
    assert not ahead & skipped
    assert ahead | skipped == set(range(head.sealed_through + 1, result.head.sealed_through + 1))


def walked(head: ChainHead, result: Plan, chain: list[AuditRow]) -> Walk:
    """The verification walk over ``chain``, from ``head`` to the plan's new head."""
    return check(Walk(chain_pos=head.chain_pos, hash=head.hash), chain, result.head.chain_pos)


@st.composite
def chains(draw: st.DrawFn) -> tuple[ChainHead, Plan, list[AuditRow], int]:
    """A chain of at least one planned row as written, and the index of one of its rows."""
    head, rows = draw(pending())
    result = plan(head, rows, NOW, GRACE)
    chain = sealed(rows, result)
    assume(chain)
    return head, result, chain, draw(st.integers(0, len(chain) - 1))


@given(pending())
def test_a_planned_chain_verifies(case: tuple[ChainHead, list[AuditRow]]) -> None:
    head, rows = case
    result = plan(head, rows, NOW, GRACE)
    walk = walked(head, result, sealed(rows, result))
    assert (walk.broken, walk.checked) == (None, len(result.seals))
    assert check_end(walk, result.head) is None


TAMPERINGS = {
    "reason": lambda row: dataclasses.replace(row, reason=f"{row.reason}-edited"),
    "arguments": lambda row: dataclasses.replace(row, arguments={**row.arguments, "x": 1}),
    "time": lambda row: dataclasses.replace(row, at=row.at + timedelta(microseconds=1)),
    "link": lambda row: dataclasses.replace(row, prev_hash="sha256:" + "2" * 64),
    "hash": lambda row: dataclasses.replace(row, hash="sha256:" + "3" * 64),
}


@given(chains(), st.sampled_from(sorted(TAMPERINGS)))
def test_a_tampered_row_is_the_first_broken_one(
    case: tuple[ChainHead, Plan, list[AuditRow], int], how: str
) -> None:
    head, result, chain, at = case
    chain[at] = TAMPERINGS[how](chain[at])
    broken = walked(head, result, chain).broken
    assert broken is not None
    assert (broken.seq, broken.chain_pos) == (chain[at].seq, head.chain_pos + 1 + at)


@given(chains())
def test_a_chain_missing_a_row_does_not_verify(
    case: tuple[ChainHead, Plan, list[AuditRow], int],
) -> None:
    head, result, chain, at = case
    del chain[at]
    walk = walked(head, result, chain)
    assert walk.broken is not None or check_end(walk, result.head) is not None
