"""Stored audit rows, read filters, the chain head and verification reports."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal, NamedTuple

from typing_extensions import TypedDict

from app.evidence import AuthorizedBy, Target

Event = Literal[
    "proposed",
    "denied",
    "dry_run",
    "approved",
    "rejected",
    "executed",
    "replayed",
    "failed",
    "reconciled",
    "expired",
    "remembered",
    "forgotten",
    "withdrawn",
]


@dataclass(frozen=True)
class AuditRow:
    """One ``audit_events`` row as stored, with the chain columns of its ``audit_seals`` row
    (None until it is sealed)."""

    seq: int
    at: datetime
    event: str
    tenant: str
    actor: str
    call_id: str | None
    run_id: str | None
    tool: str | None
    target: Target | None
    fingerprint: str | None
    arguments: Any
    decision: str | None
    code: str | None
    reason: str | None
    policy_version: str | None
    approval_id: str | None
    proposed_by: str | None
    authorized_by: AuthorizedBy | None
    outcome: dict[str, Any] | None
    total_ms: float | None
    provider_ms: float | None
    chain_pos: int | None = None
    prev_hash: str | None = None
    hash: str | None = None
    sealed_at: datetime | None = None


class CallEvent(NamedTuple):
    """An audit row as a call's history shows it (GET /calls/{id}): without its arguments,
    which the history never shows, and which a refused request naming the call records as it
    sent them, up to a body's size each."""

    seq: int
    at: datetime
    event: str
    decision: str | None
    code: str | None
    reason: str | None
    policy_version: str | None
    approval_id: str | None
    authorized_by: AuthorizedBy | None
    outcome: dict[str, Any] | None
    total_ms: float | None
    provider_ms: float | None


@dataclass(frozen=True)
class AuditFilter:
    """What a read asks for; ``tenant`` is already confined to what the caller may see."""

    tenant: str | None = None
    actor: str | None = None
    tool: str | None = None
    call_id: str | None = None
    run_id: str | None = None
    event: str | None = None
    since: datetime | None = None
    """Inclusive."""
    until: datetime | None = None
    """Exclusive."""


@dataclass(frozen=True)
class ChainHead:
    """The last sealed position and its hash, and the seq up to which nothing is pending."""

    chain_pos: int
    hash: str
    sealed_through: int


@dataclass(frozen=True)
class Checkpoint:
    """A chain head as stored and published: the head, when it was written (RFC 3339, the
    database's clock) and, when the sealer holds a signing key, that key's id and its
    signature (``app.audit.checkpoints``)."""

    chain_pos: int
    hash: str
    sealed_through: int
    at: str
    key_id: str | None = None
    signature: str | None = None

    @property
    def head(self) -> ChainHead:
        return ChainHead(self.chain_pos, self.hash, self.sealed_through)

    def as_dict(self) -> dict[str, Any]:
        return {
            "chain_pos": self.chain_pos,
            "hash": self.hash,
            "sealed_through": self.sealed_through,
            "at": self.at,
            "key_id": self.key_id,
            "signature": self.signature,
        }


@dataclass(frozen=True)
class Anchor:
    """Where the chain starts once retention removed its oldest rows: the last removed row's
    position, hash and time, and how many removed rows held seqs outside recorded gaps."""

    chain_pos: int = 0
    hash: str = "sha256:" + "0" * 64
    at: datetime | None = None
    outside_gaps: int = 0
    retention_days: int | None = None
    """The audit retention it was moved under (``None``: moved before this was recorded)."""
    key_id: str | None = None
    signature: str | None = None
    """Retention's signature over the anchor (``app.audit.checkpoints.anchor_payload``),
    with the audit signing key, when it held one."""


@dataclass(frozen=True)
class Archived:
    """A month removed by retention after its stretch of the chain was written to ``file``
    (in the archive directory): positions ``first_pos..last_pos``, the hash before the first
    and the last one's, how many rows and the file's SHA-256 (hex)."""

    file: str
    month: date
    first_pos: int
    last_pos: int
    prev_hash: str
    last_hash: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class Seal:
    """The chain columns the sealer writes for one row (an ``audit_seals`` row)."""

    seq: int
    at: datetime
    """The sealed row's ``at``: a seal is found by ``seq`` and ``at``."""
    chain_pos: int
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class Gap:
    """Seqs ``first_seq..last_seq`` passed over after chain position ``after_pos``."""

    first_seq: int
    last_seq: int
    after_pos: int


@dataclass(frozen=True)
class Unchained:
    """Rows up to ``sealed_through`` that are neither sealed nor inside a recorded gap, as far
    as a walk in seq order has read (a page of it, or all of it)."""

    last: tuple[int, datetime] | None
    """The ``(seq, at)`` of the last row read; None when no row was left."""
    count: int
    first: int | None
    """The lowest seq of those rows."""


@dataclass(frozen=True)
class Broken:
    """The first row where the chain does not hold; ``seq`` is None when rows are missing
    from the end of the chain."""

    seq: int | None
    chain_pos: int
    reason: str

    def as_dict(self) -> BrokenAnswer:
        return {"seq": self.seq, "chain_pos": self.chain_pos, "reason": self.reason}


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    checked: int
    """Sealed rows recomputed and found intact (up to the first broken one)."""
    sealed_through: int
    """Every seq up to here is sealed or was skipped (rolled back)."""
    unsealed: int
    """Rows committed but not sealed yet."""
    skipped: int
    """Seqs the sealer passed over (rolled-back transactions)."""
    first_broken: Broken | None
    stalled: int = 0
    """Unsealed rows older than the sealer could have left them: sealing has stopped."""
    signed: bool = False
    """The chain head carries a checkpoint signature that verified with toolgate's key."""
    key_id: str | None = None
    """The key the head's checkpoint names (verified or not); None when it is unsigned."""
    exported: int = 0
    """Checkpoints published outside the database that were checked against the chain."""
    removed_through: int = 0
    """Chain positions up to here were removed by retention; the walk starts after them."""
    removed_before: datetime | None = None
    """The time of the last removed row."""
    anchor_signed: bool = False
    """The chain's start (where retention cut it) carries a signature that verified."""
    archived: int = 0
    """Rows of archive files recomputed and found intact (``verify --archive``)."""
    archive_files: int = 0

    def as_dict(self) -> Verification:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "sealed_through": self.sealed_through,
            "unsealed": self.unsealed,
            "skipped": self.skipped,
            "first_broken": self.first_broken.as_dict() if self.first_broken else None,
            "stalled": self.stalled,
            "signed": self.signed,
            "key_id": self.key_id,
            "removed_through": self.removed_through,
            "anchor_signed": self.anchor_signed,
        }

    def as_json(self) -> dict[str, Any]:
        """Everything ``summary`` tells, for scripts (``toolgate audit verify --json``)."""
        return self.as_dict() | {
            "exported": self.exported,
            "removed_before": self.removed_before.isoformat() if self.removed_before else None,
            "archived": self.archived,
            "archive_files": self.archive_files,
        }

    def summary(self) -> str:
        """The report for an operator's terminal."""
        lines = [
            f"audit chain: {self._verdict()}",
            f"checked {self.checked} sealed rows; sealed through seq {self.sealed_through}; "
            f"{self.unsealed} unsealed ({self.stalled} stalled); {self.skipped} skipped seqs",
            f"chain head: {self._signature()}",
            f"checked {self.exported} exported checkpoints",
        ]
        if self.archive_files:
            lines.append(f"checked {self.archived} archived rows in {self.archive_files} files")
        if self.removed_through:
            until = self.removed_before.isoformat() if self.removed_before else "?"
            how = (
                "by retention, signed" if self.anchor_signed else "(the chain's start is unsigned)"
            )
            lines.append(f"positions 1..{self.removed_through} removed {how} (rows up to {until})")
        if self.first_broken is not None:
            broken = self.first_broken
            where = f"seq {broken.seq}" if broken.seq is not None else "end of chain"
            lines.append(
                f"first broken row: {where} (chain position {broken.chain_pos}): {broken.reason}"
            )
        return "\n".join(lines)

    def _verdict(self) -> str:
        if self.ok:
            return "intact"
        if self.first_broken is not None:
            return "BROKEN"
        return "STALLED: rows stay unsealed (sealing has stopped; see the sealer's log)"

    def _signature(self) -> str:
        if self.signed:
            return f"signed by key {self.key_id}"
        if self.key_id is None:
            return "unsigned"
        return f"signed by key {self.key_id}, NOT verified (no public key of it given)"


# --- answers, as the OpenAPI document describes them (``app.calls.answers``) ----------------


class AuditTimings(TypedDict):
    total_ms: float | None
    provider_ms: float | None


class AuditItem(TypedDict):
    """One audit row as it is published and hashed (``chain.item``)."""

    seq: int
    time: str
    event: str
    call_id: str | None
    run_id: str | None
    tenant: str
    actor: str
    tool: str | None
    target: Any
    fingerprint: str | None
    arguments: Any
    decision: str | None
    code: str | None
    reason: str | None
    policy_version: str | None
    approval_id: str | None
    proposed_by: str | None
    authorized_by: Any
    outcome: Any
    timings: AuditTimings
    hash: str | None
    """Null until the sealer has chained the row (within about a second)."""
    prev_hash: str | None


class AuditPage(TypedDict):
    """``GET /audit``: oldest first; ``next_cursor`` is null on the last page."""

    items: list[AuditItem]
    next_cursor: str | None


class BrokenAnswer(TypedDict):
    seq: int | None
    chain_pos: int
    reason: str


class Verification(TypedDict):
    """``GET /audit/verify``: the chain recomputed, and its signed head checked."""

    ok: bool
    checked: int
    sealed_through: int
    unsealed: int
    skipped: int
    first_broken: BrokenAnswer | None
    stalled: int
    signed: bool
    key_id: str | None
    removed_through: int
    """Chain positions up to here are gone: the walk starts after them."""
    anchor_signed: bool
    """Where the chain was cut (``removed_through``) is signed by toolgate's key: retention
    cut it. Not signed with a key configured, the chain is broken."""
