"""Signed checkpoints of the chain head: the audit trail made tamper-evident against anyone
who can write the database.

The hash chain alone proves that rows agree with one another, not that they are the rows
toolgate sealed: a database writer can edit a row and recompute every later hash and the
head, cut rows off the end together with the head, append a forged row, or empty the tables,
and the chain still verifies. So, as AWS CloudTrail signs its digest files, the sealer signs
every head it writes with an Ed25519 key kept outside the database
(``TOOLGATE_AUDIT_SIGNING_KEY``), stores the signature with the head, and publishes the
checkpoint outside the database (a JSON log line; an NDJSON file when
``TOOLGATE_AUDIT_CHECKPOINT_FILE`` is set):

- In the database, a head without a valid signature of the key was moved by someone without
  it: the sealer refuses to extend it (``refusal``) and verify names it (``head_problem``).
- Against published checkpoints (``toolgate audit verify --checkpoints``), each position
  must still hold its signed hash and the chain must reach the newest one (``compare``): a
  rewritten, cut or emptied chain fails, whatever the database says about itself.

What it cannot tell: a rollback to a head that was itself once signed (the database alone
cannot; the published checkpoints can), or rows forged before they were first sealed.

A checkpoint is ``{chain_pos, hash, sealed_through, at, key_id}``; its ``signature`` is the hex
Ed25519 signature of the RFC 8785 canonical JSON of exactly those five fields. ``key_id`` is
``"ed25519:"`` and the first 16 hex digits of the SHA-256 of the 32 raw public key bytes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from app.audit.models import Anchor, Broken, ChainHead, Checkpoint
from app.canonical import canonical
from app.settings import ConfigError, Settings

Exported = tuple[int, Checkpoint]
"""A published checkpoint and the line of the file it was read from."""


def payload(checkpoint: Checkpoint) -> bytes:
    """The bytes a checkpoint's signature covers."""
    return canonical(
        {
            "chain_pos": checkpoint.chain_pos,
            "hash": checkpoint.hash,
            "sealed_through": checkpoint.sealed_through,
            "at": checkpoint.at,
            "key_id": checkpoint.key_id,
        }
    )


def anchor_payload(anchor: Anchor) -> bytes:
    """The bytes an anchor's signature covers: where the chain starts, and the retention it
    was cut under."""
    return canonical(
        {
            "anchor": anchor.chain_pos,
            "hash": anchor.hash,
            "at": anchor.at.isoformat() if anchor.at else None,
            "outside_gaps": anchor.outside_gaps,
            "retention_days": anchor.retention_days,
            "key_id": anchor.key_id,
        }
    )


class PublicKey:
    """Verifies checkpoints; what an auditor holds."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self._key = key
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]

    @classmethod
    def load(cls, path: Path) -> PublicKey:
        try:
            key = serialization.load_pem_public_key(_read(path))
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ConfigError(f"{path} is not an Ed25519 public key")
        return cls(key)

    def pem(self) -> str:
        return self._key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()

    def vouches_for(self, checkpoint: Checkpoint) -> bool:
        if checkpoint.key_id != self.key_id or checkpoint.signature is None:
            return False
        return self._verifies(checkpoint.signature, payload(checkpoint))

    def vouches_for_anchor(self, anchor: Anchor) -> bool:
        if anchor.key_id != self.key_id or anchor.signature is None:
            return False
        return self._verifies(anchor.signature, anchor_payload(anchor))

    def _verifies(self, signature: str, signed: bytes) -> bool:
        try:
            self._key.verify(bytes.fromhex(signature), signed)
        except (InvalidSignature, ValueError):
            return False
        return True


class SigningKey:
    """Signs checkpoints; held by toolgate's sealer only."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public = PublicKey(key.public_key())

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(_read(path), password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path} is not an Ed25519 private key")
        return cls(key)

    def save(self, path: Path) -> None:
        """Write the private key as PKCS#8 PEM, readable by its owner only; never over an
        existing file."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as out:
            out.write(pem)

    def sign_anchor(self, anchor: Anchor) -> Anchor:
        unsigned = replace(anchor, key_id=self.public.key_id, signature=None)
        return replace(unsigned, signature=self._key.sign(anchor_payload(unsigned)).hex())

    def sign(self, head: ChainHead, at: str) -> Checkpoint:
        unsigned = Checkpoint(
            head.chain_pos, head.hash, head.sealed_through, at, key_id=self.public.key_id
        )
        return replace(unsigned, signature=self._key.sign(payload(unsigned)).hex())


_LOADED: dict[Path, SigningKey] = {}


def signing_key(settings: Settings) -> SigningKey | None:
    """The configured key (``TOOLGATE_AUDIT_SIGNING_KEY``), read once per process."""
    path = settings.audit_signing_key_file
    if path is None:
        return None
    if path not in _LOADED:
        try:
            _LOADED[path] = SigningKey.load(path)
        except ConfigError as exc:
            raise ConfigError(f"TOOLGATE_AUDIT_SIGNING_KEY: {exc}") from None
    return _LOADED[path]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def checkpoint(head: ChainHead, at: str, key: SigningKey | None) -> Checkpoint:
    """The checkpoint of a new head: signed when the sealer holds a key."""
    if key is None:
        return Checkpoint(head.chain_pos, head.hash, head.sealed_through, at)
    return key.sign(head, at)


def refusal(head: Checkpoint | None, key: SigningKey | None) -> str | None:
    """Why a sealer holding ``key`` must not extend the chain from ``head``, or None.

    A signed head is extended only by a holder of its key, and only when the signature still
    covers it: otherwise someone moved it without the key (or a sealer without the key would
    write an unsigned head over it). An unsigned head (none signed yet: a chain from before
    checkpoints, or a sealer without a key) is extended, and signed from then on if ``key``.
    """
    if head is None or head.signature is None:
        return None
    if key is None:
        return f"the chain head is signed by key {head.key_id} and this sealer holds no key"
    if head.key_id != key.public.key_id:
        return f"the chain head is signed by key {head.key_id}, not by {key.public.key_id}"
    if not key.public.vouches_for(head):
        return "the chain head does not match its signed checkpoint: it was moved without the key"
    return None


def head_problem(head: Checkpoint | None, public: PublicKey | None) -> Broken | None:
    """What is wrong with the stored head as far as ``public`` can tell."""
    if head is None or public is None or head.signature is None:
        return None
    if head.key_id != public.key_id:
        reason = f"the chain head is signed by key {head.key_id}, not by {public.key_id}"
    elif not public.vouches_for(head):
        reason = "the chain head does not match its signed checkpoint (moved without the key)"
    else:
        return None
    return Broken(None, head.chain_pos, reason)


def anchor_problem(anchor: Anchor, public: PublicKey | None) -> Broken | None:
    """What is wrong with where the chain starts, as far as ``public`` can tell: retention
    signs the anchor when it cuts the chain, so a moved start that the key does not vouch for
    was moved by someone without it (and the rows before it deleted)."""
    if anchor.chain_pos == 0 or public is None or public.vouches_for_anchor(anchor):
        return None
    return Broken(
        None,
        anchor.chain_pos,
        f"the chain starts after position {anchor.chain_pos}, but that start is not signed by "
        f"key {public.key_id}: rows were removed from the start of the chain without the key",
    )


def record(checkpoint: Checkpoint) -> bytes:
    """One published checkpoint: a line of NDJSON."""
    return orjson.dumps(checkpoint.as_dict()) + b"\n"


_FIELDS = ("chain_pos", "hash", "sealed_through", "at", "key_id", "signature")
MAX_POSITION = 2**63 - 1
"""The largest chain position or seq the database holds (``bigint``): a checkpoint's numbers
beyond it (or below 0) were never written by a sealer, and would fail the query that looks
the position up rather than be reported as a file that is not a checkpoint."""


def read(path: Path) -> list[Exported]:
    """Published checkpoints: the NDJSON file, or the sealer's JSON log lines of them (other
    keys on a line are ignored; an unsigned one's log line omits the null ``key_id`` and
    ``signature``). A line that is not a checkpoint is an error."""
    exported = []
    for number, line in enumerate(_read(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            fields = orjson.loads(line)
            exported.append((number, _parsed(fields)))
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            raise ConfigError(f"{path}, line {number}: not a checkpoint") from None
    return exported


def _parsed(fields: Mapping[str, object]) -> Checkpoint:
    chain_pos, hash_, sealed_through, at, key_id, signature = (fields.get(n) for n in _FIELDS)
    if (
        type(chain_pos) is int
        and 0 <= chain_pos <= MAX_POSITION
        and isinstance(hash_, str)
        and type(sealed_through) is int
        and 0 <= sealed_through <= MAX_POSITION
        and isinstance(at, str)
        and isinstance(key_id, str | None)
        and isinstance(signature, str | None)
    ):
        return Checkpoint(chain_pos, hash_, sealed_through, at, key_id, signature)
    raise TypeError


def compare(
    exported: Iterable[Exported],
    head: ChainHead | None,
    hashes: Mapping[int, str],
    public: PublicKey | None,
) -> Broken | None:
    """Published checkpoints against the chain: each one signed by ``public`` (when given),
    the chain reaching every one, and the row at each one's position holding its hash
    (``hashes``: chain_pos to hash, read after ``head``; rows up to it never change)."""
    end = head.chain_pos if head else 0
    for line, published in exported:
        where = f"the checkpoint on line {line} ({published.at})"
        if public is not None and not public.vouches_for(published):
            reason = f"{where} is not signed by key {public.key_id}"
        elif published.chain_pos > end:
            reason = (
                f"the chain ends at position {end}, short of {where} at position "
                f"{published.chain_pos}: rows were removed from its end or the tables emptied"
            )
        elif hashes.get(published.chain_pos) != published.hash:
            reason = f"the row at this position does not hold the hash of {where}: rewritten"
        else:
            continue
        return Broken(None, published.chain_pos, reason)
    return None


SEALING_SLACK = timedelta(days=7)
"""How long after its row was written a checkpoint may have been signed: the sealer seals a
row seconds after it commits, unless it was stopped (which verify reports as stalled)."""


def removed_early(
    exported: Iterable[Exported],
    anchor: Anchor,
    public: PublicKey | None,
    horizon: timedelta | None,
) -> Broken | None:
    """A published checkpoint of a position the chain no longer holds (at or below its
    start, the anchor), which no retention could have removed: one signed so recently that
    its row cannot yet have been older than the audit retention, or, with no retention to
    judge by, any at all. The retention is ``horizon`` (the configured one), else the one the
    anchor was cut under when ``public`` vouches for the anchor; with neither, rows were
    removed while nothing allowed it. Only checkpoints ``public`` vouches for count, when
    given; ``SEALING_SLACK`` allows for a sealer that was behind."""
    if horizon is None and anchor.retention_days and public and public.vouches_for_anchor(anchor):
        horizon = timedelta(days=anchor.retention_days)
    now = datetime.now(UTC)
    for line, published in exported:
        if published.chain_pos > anchor.chain_pos:
            continue
        if public is not None and not public.vouches_for(published):
            continue
        if horizon is None:
            return Broken(
                None,
                published.chain_pos,
                f"position {published.chain_pos} is gone (the chain starts after "
                f"{anchor.chain_pos}), but the checkpoint on line {line} proves it was sealed "
                "and no audit retention allows removing rows: rows were cut from the start",
            )
        try:
            signed = datetime.fromisoformat(published.at)
        except ValueError:
            continue
        if signed.tzinfo is not None and signed > now - horizon + SEALING_SLACK:
            return Broken(
                None,
                published.chain_pos,
                f"retention removed position {published.chain_pos} (through "
                f"{anchor.chain_pos}), but the checkpoint on line {line} shows it sealed at "
                f"{published.at}, inside the {horizon.days}-day audit retention: rows were "
                "removed before their time",
            )
    return None
