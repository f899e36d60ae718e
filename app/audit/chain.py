"""The hash chain, as pure functions: a row's published shape, its hash, the sealing plan
and the verification walk. No I/O here.

A row's hash is ``"sha256:" + hex(sha256(JCS(document)))`` where the document is the row as
``GET /audit`` publishes it (every field of docs/api.md's audit item, ``time`` in RFC 3339
UTC) without ``hash``
and with ``prev_hash``: the hash of the row sealed just before it (``GENESIS`` for the
first). Anyone holding an export can recompute it: drop ``hash`` from an item, canonicalize,
hash. Editing any field, or the link, changes it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from app.audit.models import AuditItem, AuditRow, Broken, ChainHead, Gap, Seal, Unchained
from app.canonical import SAFE_INTEGER, digest

GENESIS = "sha256:" + "0" * 64


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def item(row: AuditRow) -> AuditItem:
    """The row as ``GET /audit`` and the export publish it, and as it is hashed. Only the
    JSON and floating-point columns can hold numbers JCS cannot express."""
    return {
        "seq": row.seq,
        "time": rfc3339(row.at),
        "event": row.event,
        "call_id": row.call_id,
        "run_id": row.run_id,
        "tenant": row.tenant,
        "actor": row.actor,
        "tool": row.tool,
        "target": _jcs_domain(row.target),
        "fingerprint": row.fingerprint,
        "arguments": _jcs_domain(row.arguments),
        "decision": row.decision,
        "code": row.code,
        "reason": row.reason,
        "policy_version": row.policy_version,
        "approval_id": row.approval_id,
        "proposed_by": row.proposed_by,
        "authorized_by": _jcs_domain(row.authorized_by),
        "outcome": _jcs_domain(row.outcome),
        "timings": {
            "total_ms": _jcs_domain(row.total_ms),
            "provider_ms": _jcs_domain(row.provider_ms),
        },
        "hash": row.hash,
        "prev_hash": row.prev_hash,
    }


def _jcs_domain(value: Any) -> Any:
    """``value`` as it is published and hashed: anything JCS or a reader cannot take made
    expressible, deterministically, so that no stored value can stall the chain.

    Stored JSON may hold integers beyond 2**53 (a denied call's raw arguments), numbers that
    decode to infinity, or nesting deeper than any request may carry (written by hand or by
    an older version). Such an integer becomes the double JCS would read it as, anything
    still not finite becomes its decimal text, and a document nested deeper than
    ``MAX_DEPTH`` is stood in for by the digest of its contents (``_omitted``). Items are
    published in this form, so what a reader sees is what was hashed.
    """
    try:
        return _expressible(value, MAX_DEPTH)
    except _TooDeep:
        return _omitted(value)


MAX_DEPTH = 200
"""Deeper than any request body can nest (its parser stops at 200) and shallow enough for
every encoder and for recursion."""


class _TooDeep(Exception):
    pass


def _expressible(value: Any, depth: int) -> Any:
    if isinstance(value, dict | list):
        if depth == 0:
            raise _TooDeep
        if isinstance(value, dict):
            return {key: _expressible(inner, depth - 1) for key, inner in value.items()}
        return [_expressible(inner, depth - 1) for inner in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and abs(value) > SAFE_INTEGER:
        as_float = float(value) if value.bit_length() < 1024 else math.inf
        return as_float if math.isfinite(as_float) else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _omitted(value: Any) -> dict[str, str]:
    """A stand-in for a document too deep to publish: the digest of an unambiguous text of
    it (sorted keys), written without recursion, so any edit of it still changes the row's
    hash."""
    text = hashlib.sha256()
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, _Token):
            text.update(node.text)
        elif isinstance(node, dict):
            text.update(b"{")
            stack.append(_Token(b"}"))
            for key in sorted(node, reverse=True):
                stack += [node[key], _Token(json.dumps(key).encode() + b":")]
        elif isinstance(node, list):
            text.update(b"[")
            stack.append(_Token(b"]"))
            stack.extend(reversed(node))
        else:
            text.update(json.dumps(_expressible(node, 0)).encode() + b",")
    return {
        "omitted": f"nested deeper than {MAX_DEPTH} levels",
        "digest": "sha256:" + text.hexdigest(),
    }


@dataclass(frozen=True)
class _Token:
    text: bytes


def row_hash(row: AuditRow, prev_hash: str) -> str:
    return _hash(item(row), prev_hash)


def _hash(document: Mapping[str, Any], prev_hash: str) -> str:
    """The hash of a published row: of everything it shows but its own hash, linked to the
    row before it by ``prev_hash``."""
    hashed = {name: value for name, value in document.items() if name != "hash"}
    hashed["prev_hash"] = prev_hash
    return digest(hashed)


_DOCUMENTS = ("target", "arguments", "authorized_by", "outcome")


def stood_in(document: Mapping[str, Any]) -> list[str]:
    """The JSON fields of a published row that hold a stand-in (``_omitted``, or the
    database facade's for a document it could not read) instead of what is stored."""
    return [
        name
        for name in _DOCUMENTS
        if isinstance(value := document[name], dict)
        and value.keys() == {"omitted", "digest"}
        and str(value["digest"]).startswith("sha256:")
    ]


@dataclass
class Plan:
    """What one sealing pass writes: seals in chain order, gaps to record, the new head."""

    head: ChainHead
    seals: list[Seal] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    waiting: bool = False
    """Stopped at a seq that is missing but younger than the grace period."""
    stood_in: dict[int, list[str]] = field(default_factory=dict)
    """Sealed rows whose published form stands in for a stored document, by seq."""


def plan(head: ChainHead, unsealed: Sequence[AuditRow], now: datetime, grace: timedelta) -> Plan:
    """Extend the chain with ``unsealed`` (committed, unsealed rows in seq order).

    A row at or below ``head.sealed_through`` is late: its seq was skipped earlier and its
    transaction committed after all; it joins the chain at the end. Above it, rows are
    sealed only as a contiguous run of seqs. At a missing seq the plan stops, unless the
    row after the gap was inserted more than ``grace`` ago: sequence values are handed out
    in order, so the missing seq's transaction has then been open (or gone) for longer than
    that, and the gap is recorded and passed over.
    """
    result = Plan(head=head)
    extend(result, unsealed, now, grace)
    return result


def extend(result: Plan, unsealed: Sequence[AuditRow], now: datetime, grace: timedelta) -> None:
    """Continue ``result`` with the next ``unsealed`` rows, as ``plan`` would have."""
    if result.waiting:
        return
    for row in unsealed:
        head = result.head
        if row.seq <= head.sealed_through:
            _append(result, row, head.sealed_through)
            continue
        if row.seq > head.sealed_through + 1:
            if now - row.at < grace:
                result.waiting = True
                break
            result.gaps.append(Gap(head.sealed_through + 1, row.seq - 1, head.chain_pos))
        _append(result, row, row.seq)


def _append(result: Plan, row: AuditRow, sealed_through: int) -> None:
    head = result.head
    document = item(row)
    if fields := stood_in(document):
        result.stood_in[row.seq] = fields
    seal = Seal(row.seq, row.at, head.chain_pos + 1, head.hash, _hash(document, head.hash))
    result.seals.append(seal)
    result.head = ChainHead(seal.chain_pos, seal.hash, sealed_through)


@dataclass(frozen=True)
class Walk:
    """Where a verification walk stands: the last intact position and its hash."""

    chain_pos: int = 0
    hash: str = GENESIS
    seq: int | None = None
    checked: int = 0
    broken: Broken | None = None


def check(walk: Walk, rows: Sequence[AuditRow], end: int) -> Walk:
    """Continue ``walk`` over ``rows`` (sealed rows in chain order) up to the first break;
    ``end`` is the head's position, past which no row may be sealed."""
    for row in rows:
        expected = walk.chain_pos + 1
        if row.chain_pos != expected:
            reason = f"the sealed row at chain position {expected} is missing"
            return replace(walk, broken=Broken(row.seq, expected, reason))
        walk = _link(walk, item(row), end)
        if walk.broken is not None:
            return walk
    return walk


def check_items(walk: Walk, items: Iterable[dict[str, Any]], end: int) -> Walk:
    """Continue ``walk`` over published items (``item``, hash included) that hold the next
    chain positions one after the other, as an archive file does, up to the first break."""
    for document in items:
        walk = _link(walk, document, end)
        if walk.broken is not None:
            return walk
    return walk


def _link(walk: Walk, document: Mapping[str, Any], end: int) -> Walk:
    """``walk`` moved on by the published row ``document`` at the next position."""
    expected, seq = walk.chain_pos + 1, document.get("seq")
    stored, prev_hash = document.get("hash"), document.get("prev_hash")
    computed = _hash(document, walk.hash)
    broken = None
    if expected > end:
        broken = f"sealed beyond the recorded chain head (position {end})"
    elif prev_hash != walk.hash:
        broken = "prev_hash does not match the hash of the row sealed before it"
    elif stored != computed:
        broken = "the row's contents do not match its hash (the row was altered)"
    if broken is not None:
        return replace(walk, broken=Broken(seq if isinstance(seq, int) else None, expected, broken))
    return Walk(expected, computed, seq if isinstance(seq, int) else None, walk.checked + 1)


def check_end(walk: Walk, head: ChainHead | None) -> Broken | None:
    """After a complete walk: the chain must end where the head says it does."""
    end = head.chain_pos if head else 0
    if end > walk.chain_pos:
        reason = (
            f"the chain ends at position {walk.chain_pos} but was sealed through position "
            f"{end}: sealed rows were removed from its end"
        )
        return Broken(None, walk.chain_pos + 1, reason)
    if head is not None and head.hash != walk.hash:
        reason = "the last sealed row does not match the recorded chain head"
        return Broken(walk.seq, walk.chain_pos, reason)
    return None


def check_accounts(head: ChainHead | None, beyond: int, uncovered: int) -> Broken | None:
    """Sealed and skipped rows must add up: no row carries chain columns outside the chain
    (``beyond``), and every seq up to ``sealed_through`` is sealed or inside a recorded gap
    (``uncovered`` are neither)."""
    end = head.chain_pos if head else 0
    if beyond:
        return Broken(None, end, f"{beyond} rows carry chain columns but are not in the chain")
    if uncovered:
        through = head.sealed_through if head else 0
        reason = f"{uncovered} seqs up to {through} are neither sealed nor recorded as skipped"
        return Broken(None, end, reason)
    return None


def check_unchained(head: ChainHead | None, unchained: Unchained | None) -> Broken | None:
    """Every row up to ``sealed_through`` is in the chain or inside a recorded gap: one the
    chain passed by (``unchained``, None when not counted) was added behind its back."""
    if unchained is None or not unchained.count:
        return None
    through = head.sealed_through if head else 0
    reason = (
        f"{unchained.count} rows up to seq {through} are neither sealed nor inside a recorded "
        "gap: added under a seq the chain had already passed (a seq another row holds, or "
        "one retention removed)"
    )
    return Broken(unchained.first, head.chain_pos if head else 0, reason)
