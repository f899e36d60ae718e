"""The HTTP/1.1 protocol ``toolgate serve`` runs: uvicorn's httptools protocol with a cap on
the request head.

httptools keeps the request line and headers in memory without bound, and a header that
arrives in pieces is copied whole for every piece, before the app (and so authentication)
sees anything: one client could make a worker hold and copy many megabytes. Here the head
(request line and headers) may be at most ``MAX_HEAD_BYTES``; a longer one is answered 431
as a problem (``invalid_request``) and the connection closed, after reading at most that
much plus one network read. The trailer fields after a chunked body are held by the parser
as the head's are: they are ignored, and limited the same way. Bodies are limited in the
app (``main.RequestLimits``). What the parser cannot read at all is answered 400 as a
problem too (``invalid_request``), where uvicorn answers plain text.

A request must also arrive whole, head and body, within ``ARRIVAL_S`` of its first byte:
uvicorn times out idle connections between requests, but not one that sends a request a
byte at a time, so a few thousand slow clients could hold every file descriptor. The timer
is armed only when a read ends with a request still arriving, so a request that comes in
one read, the usual case, costs none.

toolgate serves no WebSocket, so a request asking to upgrade to one is answered as the
ordinary request it also is, under these limits: uvicorn's WebSocket protocol has neither
(a handshake with a long path was never answered, its connection held for good), and it
logged every attempt with its path. The connection then closes: nothing sent after a request
asking for any upgrade (h2c too) is read as a request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.errors import HeadersTooLarge, InvalidRequest, ToolgateError

MAX_HEAD_BYTES = 64 * 1024
LINGER_S = 1.0
ARRIVAL_S = 30.0


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing; uvicorn then answers through
    ``send_400_response``, which answers 431 instead."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading_head = True
        self.head_bytes = 0
        """Bytes received while a head was being read (an upper bound of its size)."""
        self.refused = False
        self.arriving = False
        """A request has begun and its last byte has not come yet."""
        self.arrival: asyncio.TimerHandle | None = None
        self.trailing = False
        """The last chunk header began what has come since: trailer fields, unless data."""

    def data_received(self, data: bytes) -> None:
        if self.reading_head or self.trailing:
            self.head_bytes += len(data)
        super().data_received(data)
        if (self.reading_head or self.trailing) and self.head_bytes > MAX_HEAD_BYTES:
            self.refuse_head()
        if self.arriving and self.arrival is None:
            self.arrival = self.loop.call_later(ARRIVAL_S, self.too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.reading_head = True
        self.head_bytes = 0
        self.arriving = True
        self.trailing = False

    def on_chunk_header(self) -> None:
        """A chunk's data follows, or, after the last chunk, the trailer fields: they are
        counted from here, against the same limit as the head."""
        self.trailing = True
        self.head_bytes = 0

    def on_body(self, body: bytes) -> None:
        self.trailing = False
        self.head_bytes = 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.arrived()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.arrived()
        super().connection_lost(exc)

    def arrived(self) -> None:
        self.arriving = False
        if self.arrival is not None:
            self.arrival.cancel()
            self.arrival = None

    def too_slow(self) -> None:
        """The request did not arrive in time: close; an app still reading its body sees the
        client gone."""
        self.arrival = None
        if self.arriving and not self.transport.is_closing():
            self.logger.info("Request not received within %.0f s; connection closed.", ARRIVAL_S)
            self.transport.close()

    def _should_upgrade(self) -> bool:
        return False

    def _unsupported_upgrade_warning(self) -> None:
        """Not logged: anyone can ask for an upgrade, and the request is answered anyway.
        httptools stops reading at its head and would parse what follows (its body, say) as
        new requests, which a proxy holds to be part of this one: the connection ends once
        this request is answered."""
        self.cycle.keep_alive = False

    def on_headers_complete(self) -> None:
        """The exact size is known now: the last read may also have held body bytes."""
        self.reading_head = False
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > MAX_HEAD_BYTES:
            self.head_bytes = size
            raise _HeadTooLarge
        super().on_headers_complete()
        # A trailer field is never taken for a header (RFC 9110 §6.5.1): uvicorn appends
        # what the parser reports to the list the request's scope holds, so a token sent
        # after the body, which a proxy in front that checked the head never saw, counted.
        # Trailers land in a list nobody reads instead (no cost per header).
        self.headers = []

    def send_400_response(self, msg: str) -> None:
        """What the parser refuses (uvicorn's own answer is plain text): a problem too."""
        if self.head_bytes > MAX_HEAD_BYTES:
            self.refuse_head()
        else:  # uvicorn has logged ``msg``
            self.refuse(InvalidRequest("the request is not valid HTTP/1.1"))

    def refuse_head(self) -> None:
        error = HeadersTooLarge(
            f"the request line and headers, or the trailers, exceed {MAX_HEAD_BYTES} bytes"
        )
        if self.refuse(error):
            self.logger.warning("Request head over %d bytes refused.", MAX_HEAD_BYTES)

    def refuse(self, error: ToolgateError) -> bool:
        """Answer ``error`` as a problem and close the connection, unless that is done
        already; whether it was answered now."""
        if self.refused or self.transport.is_closing():
            return False
        self.refused = True
        body = orjson.dumps(error.problem())
        head = [STATUS_LINE[error.status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend(
            [
                b"content-type: application/problem+json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(head))
        # Closing now, with the rest of the header unread, would make the kernel reset the
        # connection and the client lose the answer: end the writing side, stop reading, and
        # close a moment later.
        self.transport.write_eof()
        self.transport.pause_reading()
        self.loop.call_later(LINGER_S, self.transport.close)
        return True
