"""Content digests: ``"sha256:" + hex(sha256(RFC 8785 canonical JSON))``.

One definition for fingerprints, snapshot hashes and audit row hashes, so that key order and
whitespace never change any of them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def digest(document: Any) -> str:
    """Raises ``rfc8785.CanonicalizationError`` for what JSON cannot say exactly."""
    return "sha256:" + hashlib.sha256(rfc8785.dumps(document)).hexdigest()
