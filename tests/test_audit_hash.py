"""The chain's pure parts: what a row's hash covers, and the sealing plan. No I/O."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
import rfc8785

from app.audit.chain import GENESIS, check, check_end, item, plan, row_hash
from app.audit.chain import Walk as ChainWalk
from app.audit.models import AuditRow, ChainHead, Gap

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
GRACE = timedelta(seconds=5)
CHAIN_COLUMNS = {"chain_pos", "prev_hash", "hash", "sealed_at"}


def row(seq: int, age_s: float = 0.0, **fields: Any) -> AuditRow:
    values: dict[str, Any] = {
        "seq": seq,
        "at": NOW - timedelta(seconds=age_s),
        "event": "executed",
        "tenant": "acme",
        "actor": "alice",
        "call_id": "call_1",
        "run_id": "run_1",
        "tool": "issue_refund",
        "target": {"type": "order", "id": "ord_1"},
        "fingerprint": "sha256:ab",
        "arguments": {"order_id": "ord_1", "amount": 20.0, "note": "[redacted]"},
        "decision": "allow",
        "code": None,
        "reason": None,
        "policy_version": "v1#abc123",
        "approval_id": "apr_1",
        "proposed_by": "model",
        "authorized_by": {"kind": "policy", "sub": "alice"},
        "outcome": {"status": "succeeded", "provider_status": 201},
        "total_ms": 12.5,
        "provider_ms": 8.25,
    }
    return AuditRow(**{**values, **fields})


def changed(value: Any) -> Any:
    if isinstance(value, datetime):
        return value + timedelta(microseconds=1)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, dict):
        return {**value, "x": 1}
    return f"{value}-changed"


@pytest.mark.parametrize(
    "name",
    [f.name for f in dataclasses.fields(AuditRow) if f.name not in CHAIN_COLUMNS],
)
def test_changing_any_audit_field_changes_the_hash(name: str) -> None:
    original = row(7)
    edited = dataclasses.replace(original, **{name: changed(getattr(original, name))})
    assert row_hash(edited, GENESIS) != row_hash(original, GENESIS)


def test_the_hash_covers_the_link_but_not_key_order() -> None:
    original = row(7)
    assert row_hash(original, GENESIS) != row_hash(original, "sha256:" + "1" * 64)
    reordered = dataclasses.replace(
        original, arguments=dict(reversed(list(original.arguments.items())))
    )
    assert row_hash(reordered, GENESIS) == row_hash(original, GENESIS)


def test_anyone_can_recompute_a_hash_from_the_published_item() -> None:
    sealed = dataclasses.replace(row(3), prev_hash=GENESIS, hash=row_hash(row(3), GENESIS))
    published = orjson.loads(orjson.dumps(item(sealed)))
    claimed = published.pop("hash")
    assert claimed == "sha256:" + hashlib.sha256(rfc8785.dumps(published)).hexdigest()


def test_numbers_json_canonicalization_refuses_still_hash_and_publish() -> None:
    odd = row(1, arguments={"big": 10**30, "huge": 10**400, "neg": -(2**60)})
    assert row_hash(odd, GENESIS).startswith("sha256:")
    published = item(odd)["arguments"]
    assert published["big"] == 1e30
    assert published["huge"] == str(10**400)
    orjson.dumps(item(odd))


def test_a_contiguous_run_is_sealed_in_seq_order() -> None:
    result = plan(ChainHead(0, GENESIS, 0), [row(1), row(2), row(3)], NOW, GRACE)
    assert [(s.seq, s.chain_pos) for s in result.seals] == [(1, 1), (2, 2), (3, 3)]
    assert result.seals[0].prev_hash == GENESIS
    assert [s.prev_hash for s in result.seals[1:]] == [s.hash for s in result.seals[:-1]]
    assert result.head == ChainHead(3, result.seals[-1].hash, 3)
    assert (result.gaps, result.waiting) == ([], False)


def test_a_young_gap_stops_the_run_and_an_old_one_is_recorded() -> None:
    head = ChainHead(4, "sha256:h4", 4)
    young = plan(head, [row(5), row(7, age_s=1)], NOW, GRACE)
    assert [s.seq for s in young.seals] == [5]
    assert (young.head.sealed_through, young.waiting, young.gaps) == (5, True, [])
    old = plan(head, [row(5), row(8, age_s=6), row(9)], NOW, GRACE)
    assert [(s.seq, s.chain_pos) for s in old.seals] == [(5, 5), (8, 6), (9, 7)]
    assert old.gaps == [Gap(6, 7, 5)]
    assert (old.head.sealed_through, old.waiting) == (9, False)


def test_a_late_row_joins_the_end_of_the_chain() -> None:
    head = ChainHead(6, "sha256:h6", 9)
    result = plan(head, [row(7), row(10)], NOW, GRACE)
    assert [(s.seq, s.chain_pos) for s in result.seals] == [(7, 7), (10, 8)]
    assert result.seals[0].prev_hash == "sha256:h6"
    assert result.head.sealed_through == 10


def test_the_walk_names_the_first_broken_row() -> None:
    result = plan(ChainHead(0, GENESIS, 0), [row(1), row(2), row(3)], NOW, GRACE)
    sealed = [
        dataclasses.replace(row(s.seq), chain_pos=s.chain_pos, prev_hash=s.prev_hash, hash=s.hash)
        for s in result.seals
    ]
    intact = check(ChainWalk(), sealed, 3)
    assert (intact.broken, intact.checked) == (None, 3)
    assert check_end(intact, result.head) is None
    edited = [sealed[0], dataclasses.replace(sealed[1], reason="edited"), sealed[2]]
    broken = check(ChainWalk(), edited, 3).broken
    assert broken is not None
    assert (broken.seq, broken.chain_pos) == (2, 2)
    hole = check(ChainWalk(), [sealed[0], sealed[2]], 3).broken
    assert hole is not None
    assert (hole.seq, hole.chain_pos) == (3, 2)
    short = check(ChainWalk(), sealed[:2], 3)
    end = check_end(short, result.head)
    assert end is not None
    assert (end.seq, end.chain_pos) == (None, 3)
    beyond = check(ChainWalk(), sealed, 2).broken
    assert beyond is not None
    assert (beyond.seq, beyond.chain_pos) == (3, 3)
