"""Resolving ``x-egress`` hosts, so policy can refuse any non-public address."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

RESOLVE_TIMEOUT_S = 2.0


def literal(host: str) -> tuple[str, ...] | None:
    """The address ``host`` is, when it is an IP address written out (nothing to resolve)."""
    try:
        return (str(ipaddress.ip_address(host)),)
    except ValueError:
        return None


async def resolve(host: str) -> tuple[str, ...]:
    """Every address ``host`` resolves to; empty when it does not resolve (a denial)."""
    written = literal(host)
    if written is not None:
        return written
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (TimeoutError, OSError, UnicodeError):
        return ()
    return tuple(sorted({str(info[4][0]) for info in infos}))
