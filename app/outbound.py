"""The one place toolgate speaks HTTP to the outside: catalog providers and the JWKS issuer.

aiohttp's client is used because it was measured at several times httpx's throughput under
concurrency on this hardware (see ``bench/``). Library exceptions are translated here into
two outcomes that matter for exactly-once: the request certainly did not reach the peer
(``NotSent``), or it may have (``Uncertain``); an answer longer than the caller's limit is
``TooLarge``, a kind of ``Uncertain``. A mutation is sent ``once``: aiohttp never resends
it by itself, so that every attempt that may have reached the peer is one toolgate knows
of, under one operation id. Redirects are never followed, and cookies
are never kept: one session serves every principal, so a cookie a provider set on one
user's call would otherwise ride along on the next user's call to that host.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp
import orjson
from yarl import URL

from app.recordable import recorded


class NotSent(Exception):
    """The peer was not reached; nothing can have happened there. Certain for a request sent
    ``once``; for another of an idempotent method, a connect failure may follow a first
    attempt aiohttp resent, which is why a mutation is sent ``once``."""


class Uncertain(Exception):
    """The request may have been received; its effect is unknown."""


class TooLarge(Uncertain):
    """The peer answered with a body longer than the limit, so its answer was not read; the
    request was received and may have had its effect."""


DEFAULT_MAX_BYTES = 1 << 20
"""Bodies are read into memory, so every answer is capped: a provider (or a JWKS issuer)
cannot make a worker buffer an unbounded body."""


MAX_DEPTH = 128
"""How deeply a body may nest to be read as JSON. toolgate carries a provider's body inside
its own answers and records, and orjson writes no more than 254 levels (nor does Python's
recursion limit allow copying or hashing much deeper), so a deeper body is not JSON here,
just as orjson itself refuses one past 1024 levels."""


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")


def _may_not_fit(raw: bytes) -> bool:
    """Whether a JSON text orjson reads may hold what toolgate cannot store and hash as it
    is: an escaped NUL, or an integer beyond ±(2**53-1), which has at least 16 digits (lone
    surrogates and non-finite numbers orjson refuses itself). Two scans in C instead of
    rebuilding every answer. (``find``, not ``in``: ``bytes.__contains__`` first tries its
    operand as an integer, raising and clearing a TypeError on every call.)"""
    return raw.find(b"\\u0000") >= 0 or raw.translate(_DIGITS_AS_ZERO).find(b"0" * 16) >= 0


class Response(NamedTuple):
    status: int
    body: Any
    """Parsed JSON, or ``None`` when the body was empty, not JSON, or nested deeper than
    ``MAX_DEPTH``. It is in the form toolgate can store and hash (``recordable.recorded``:
    a NUL as the text ``\\u0000``, an integer beyond ±(2**53-1) as its digits), since a
    provider's answer is stored after it may have acted."""
    elapsed_ms: float


class _Dropped(aiohttp.ClientError):
    """A connection that failed after the request may have been written: what aiohttp would
    answer by sending the request again, under a class it does not resend."""


async def _sent_once(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """A client middleware that makes one request one attempt. aiohttp sends a request of an
    idempotent method (``GET``, ``HEAD``, ``OPTIONS``, ``TRACE``, ``PUT``, ``DELETE``) a
    second time, over a new connection, when the first attempt ends in ``ClientOSError`` or
    ``ServerDisconnectedError``, whether the connection was a kept-alive one or not, and
    whether or not the peer had already acted. Its middlewares run once per attempt, inside
    that loop, so this one turns those two into ``_Dropped``, which ends it. A connect
    failure (``ClientConnectorError``) is left as it is: nothing was written, and aiohttp
    does not resend it either."""
    try:
        return await handler(request)
    except aiohttp.ClientConnectorError:
        raise
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        raise _Dropped(_described(exc)) from exc


_ONCE = (_sent_once,)


class Outbound:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=256, ttl_dns_cache=60)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar()
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        status_only: bool = False,
        once: bool = False,
    ) -> Response:
        """Send ``url`` exactly as written: it must already be percent-encoded, and is never
        re-encoded or normalized (``/a/../b`` stays as it is), so the peer receives the path
        the caller built. ``params`` are encoded and appended to its query. ``status_only``:
        the answer's body is not read at all (the connection is closed instead), for a caller
        that judges by the status alone.

        ``once``: the request is written at most once (a mutation's). aiohttp would otherwise
        send it again by itself when the connection drops before the answer, and a connect
        failure of that second attempt would read as ``NotSent`` though the first may have
        acted. With it, a connect failure is always of the only attempt (``NotSent``), and a
        connection lost after it is ``Uncertain``. Without it (reads, previews, lookups), a
        kept-alive connection the peer has just closed costs a resend, not a failure.

        Raises ``NotSent``, ``Uncertain``, or ``TooLarge`` past ``max_bytes`` of body."""
        assert self._session is not None, "Outbound.start() was not awaited"
        started = time.perf_counter()
        if json is not None:
            headers = {**(headers or {}), "Content-Type": "application/json"}
        try:
            target = URL(url, encoded=True)
        except ValueError as exc:
            raise NotSent(f"invalid URL: {_described(exc)}") from exc
        try:
            async with self._session.request(
                method,
                target,
                headers=headers,
                data=orjson.dumps(json) if json is not None else None,
                params=params,
                timeout=_timeout(timeout_s),
                allow_redirects=False,
                middlewares=_ONCE if once else None,
            ) as response:
                status = response.status
                if status_only:
                    response.close()
                    raw = b""
                else:
                    raw = await _read(response, max_bytes)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise NotSent(_described(exc)) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise Uncertain(_described(exc)) from exc
        return Response(status, _parsed(raw), (time.perf_counter() - started) * 1000)


def _parsed(raw: bytes) -> Any:
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    # Only a body with more brackets than MAX_DEPTH can nest deeper: most are never walked.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than(body, MAX_DEPTH):
        return None
    # Likewise only a body whose text holds what may not fit is rebuilt.
    return recorded(body) if _may_not_fit(raw) else body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


async def _read(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body as it arrives, given up on (and the connection with it) as soon as it is
    longer than ``max_bytes``: never more than that plus one chunk in memory. A declared
    ``Content-Length`` over the limit is refused before any of it is read. The count is of
    decoded bytes, so a compressed body cannot expand past the limit either."""
    if response.content_length is not None and response.content_length > max_bytes:
        response.close()
        raise TooLarge(f"the answer declares {response.content_length} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > max_bytes:
            response.close()
            raise TooLarge(f"the answer is longer than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


_URLS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")


def site(url: str) -> str:
    """What a log or a message may tell of a URL: its scheme, host and port. The rest can be
    a credential (userinfo, or a token in the path or query, as many receivers issue them)
    or a call's arguments (filled into a provider's path or query)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(a URL)"
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def _described(exc: BaseException) -> str:
    """The exception's class and message, every URL in it cut to its ``site``: aiohttp's
    messages quote the URL they requested (a timeout, an answer it cannot parse)."""
    return f"{type(exc).__name__}: {_URLS.sub(lambda url: site(url[0]), str(exc))}"


@lru_cache(maxsize=64)
def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds, connect=seconds)
