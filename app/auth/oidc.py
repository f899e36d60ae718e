"""Where the console signs approvers in: the OpenID provider of ``TOOLGATE_OIDC_ISSUER``, as
its discovery document describes it.

toolgate reads the discovery document itself (the browser needs no access to it), checks
that it names the configured issuer, and that its endpoints are ``https://`` (plain
``http://`` only on this machine), and tells the console's script where to send the
approver and where to redeem the code (``GET /console/config``). The script runs the
authorization-code flow with PKCE (S256), ``state`` and ``nonce`` in the browser, as a
public client; the ID token it gets is the bearer token every API call sends, verified
like any other (``TokenVerifier``: the issuer's keys, issuer, audience, expiry).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import NamedTuple
from urllib.parse import urlsplit

from app.errors import Unavailable
from app.outbound import NotSent, Outbound, Uncertain
from app.settings import Settings, loopback

DISCOVERY_MAX_AGE_S = 3600.0
"""How long a discovery document is used before it is read again."""
DISCOVERY_RETRY_S = 10.0
"""After a failed read, how long before the next one is tried."""
DISCOVERY_TIMEOUT_S = 5.0


class Provider(NamedTuple):
    """What the console's script needs to sign someone in."""

    issuer: str
    client_id: str
    authorization_endpoint: str
    token_endpoint: str

    @property
    def token_origin(self) -> str:
        """The origin the script redeems codes at (the page's ``connect-src`` names it),
        rebuilt from its parts (``_usable`` admits only plain host names and addresses)."""
        parts = urlsplit(self.token_endpoint)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


class Discovery:
    """The configured provider, read from its discovery document when first needed and
    kept ``DISCOVERY_MAX_AGE_S``; ``None`` throughout when no issuer is configured."""

    def __init__(self, settings: Settings, outbound: Outbound) -> None:
        self._issuer, self._client_id = settings.oidc_issuer, settings.oidc_client_id
        self._outbound = outbound
        self._provider: Provider | None = None
        self._read_at = self._failed_at = -DISCOVERY_MAX_AGE_S
        self._lock = asyncio.Lock()

    async def provider(self) -> Provider | None:
        """The provider, read again when its document is older than ``DISCOVERY_MAX_AGE_S``;
        ``Unavailable`` when it cannot be read (or says something unusable) and none is
        held."""
        if self._issuer is None or self._client_id is None:
            return None
        async with self._lock:
            now = time.monotonic()
            fresh = now - self._read_at < DISCOVERY_MAX_AGE_S
            if not fresh and now - self._failed_at >= DISCOVERY_RETRY_S:
                try:
                    self._provider = await self._read(self._issuer, self._client_id)
                    self._read_at = now
                except Unavailable:
                    self._failed_at = now
                    if self._provider is None:
                        raise
        if self._provider is None:
            raise Unavailable("the sign-in provider's discovery document cannot be read")
        return self._provider

    async def _read(self, issuer: str, client_id: str) -> Provider:
        url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            response = await self._outbound.request("GET", url, timeout_s=DISCOVERY_TIMEOUT_S)
        except (NotSent, Uncertain) as exc:
            raise Unavailable("the sign-in provider cannot be reached") from exc
        document = response.body
        if response.status != 200 or not isinstance(document, dict):
            raise Unavailable("the sign-in provider's discovery document cannot be read")
        if document.get("issuer") != issuer:  # OpenID Connect Discovery 1.0, section 4.3
            raise Unavailable("the sign-in provider's discovery document names another issuer")
        endpoints = [document.get(key) for key in ("authorization_endpoint", "token_endpoint")]
        if not all(isinstance(e, str) and _usable(e) for e in endpoints):
            raise Unavailable("the sign-in provider's endpoints are not https:// URLs")
        authorization, token = (str(e) for e in endpoints)
        return Provider(issuer, client_id, authorization, token)


def _usable(url: str) -> bool:
    """An absolute ``https://`` URL (``http://`` to this machine) without credentials or a
    fragment, whose host is a plain name or address (it goes into a page's policy)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises on a port that is not a number in range
    except ValueError:
        return False
    if parts.fragment or parts.username is not None or not parts.hostname:
        return False
    if not re.fullmatch(r"[a-z0-9.-]+|[0-9a-f:.]+", parts.hostname):
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and loopback(parts.hostname))
