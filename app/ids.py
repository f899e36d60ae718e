"""Opaque identifiers: a type prefix, the time in milliseconds and 80 random bits.

The time comes first (48 bits, hex), so ids made one after another sort together and a
new row's primary-key entry lands on the right-most leaf of its index, as a sequence's
would, instead of on a random page of an index far larger than memory. The 80 random
bits keep ids unguessable; the time in them is no secret (every row carries its own).
"""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"
