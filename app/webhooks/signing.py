"""Standard Webhooks signatures: HMAC-SHA256 over ``id.timestamp.body``, pure and small
enough to own rather than import (tests check it against the reference library)."""

from __future__ import annotations

import hmac
from base64 import b64decode, b64encode
from hashlib import sha256


def headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers a receiver verifies ``body`` with; ``secret`` is ``whsec_<base64>``."""
    key = b64decode(secret.removeprefix("whsec_"))
    signed = b"%s.%d.%s" % (message_id.encode(), timestamp, body)
    signature = b64encode(hmac.new(key, signed, sha256).digest()).decode()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,{signature}",
    }
