"""Known values' digests: keyed, so that a leaked table or audit trail gives nothing a word
list can reverse.

A known value is stored and looked up by ``hmac-sha256:<key id>:<hex>``: HMAC-SHA256, under
the server's key (``TOOLGATE_KNOWN_VALUES_KEY``), of its kind and its form as endorsement
compares values (``comparison.form``). A plain hash of a password is reversed by anyone who
holds the audit trail and a list of likely passwords; without the key, nobody can test a
guess. The key id names the key a digest was made under (the key's own HMAC of a fixed
label, cut short: it tells nothing of the key), so that a rotation finds what to digest
again. Pure: the keys are given.
"""

from __future__ import annotations

import hashlib
import hmac
from functools import lru_cache

from app.runs.comparison import compared

PREFIX = "hmac-sha256:"


@lru_cache(maxsize=8)
def under(key: bytes) -> str:
    """How every digest made under ``key`` starts: the prefix and the key's id."""
    key_id = hmac.new(key, b"toolgate known-values key id", hashlib.sha256).hexdigest()[:8]
    return f"{PREFIX}{key_id}:"


def digest(key: bytes, kind: str, value: str) -> str:
    """A known value's key under ``key``: its kind and compared form, keyed."""
    material = f"{kind}\0{compared(value).form}".encode()
    return under(key) + hmac.new(key, material, hashlib.sha256).hexdigest()


def lookups(keys: tuple[bytes, ...], kind: str, value: str) -> tuple[str, ...]:
    """The digests a known value may be stored under: one per configured key (the current
    one, and the previous one while a rotation lasts)."""
    return tuple(digest(key, kind, value) for key in keys)
