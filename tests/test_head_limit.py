"""A real ``toolgate serve`` refuses an oversized request head before the app sees it, and
its memory does not grow with what a client sends."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import select
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app import protocol
from app.protocol import MAX_HEAD_BYTES
from tests.conftest import served as served_app
from tests.flows import Auth
from tests.test_instances import Instance


@pytest.fixture
async def served(env: dict[str, str]) -> AsyncIterator[Instance]:
    instance = Instance(env)
    try:
        await instance.ready()
        yield instance
    finally:
        instance.stop()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one response the server sends before closing."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def assert_refused(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 431
    assert headers["content-type"] == "application/problem+json"
    assert orjson.loads(body)["code"] == "invalid_request"


async def test_a_huge_header_is_refused_early_and_the_worker_does_not_grow(
    served: Instance,
) -> None:
    """A 64 MiB header sent in 64 KiB pieces: the answer comes after the first few."""
    before = rss_kib(served.process.pid)
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: toolgate\r\nx-big: ")
        sent, started, piece = 0, time.monotonic(), b"a" * 65536
        while sent < 64 * 1024 * 1024 and not select.select([sock], [], [], 0.05)[0]:
            sock.sendall(piece)
            sent += len(piece)
        assert_refused(*answer(sock))
    assert time.monotonic() - started < 5
    assert sent <= 4 * len(piece), "the server kept reading the header"
    assert rss_kib(served.process.pid) - before < 4 * 1024


async def test_a_head_over_the_limit_in_one_read_is_refused(served: Instance) -> None:
    head = b"GET /healthz HTTP/1.1\r\nhost: toolgate\r\nx-big: " + b"a" * MAX_HEAD_BYTES
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + b"\r\n\r\n")
        assert_refused(*answer(sock))


async def test_many_headers_just_under_the_limit_and_a_large_body_are_served(
    served: Instance, auth: Auth
) -> None:
    headers = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 1000) for i in range(50))
    body = orjson.dumps({"tool": "create_ticket", "arguments": {"subject": "s" * 600_000}})
    token = auth()["Authorization"].encode()
    request = (
        b"POST /propose HTTP/1.1\r\nhost: toolgate\r\nconnection: close\r\n"
        b"content-type: application/json\r\nauthorization: "
        + token
        + b"\r\n"
        + headers
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(request)
        status, _, answered = answer(sock)
    assert status == 422, answered
    assert orjson.loads(answered)["code"] == "invalid_arguments"


async def test_the_limit_applies_to_each_request_of_a_kept_alive_connection(
    served: Instance,
) -> None:
    """Two requests with heads of 40 KiB each are served; a third of 80 KiB is refused."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(
                b"GET /healthz HTTP/1.1\r\nhost: toolgate\r\nx-h: %s\r\n\r\n" % (b"a" * 40_000)
            )
            response = b""
            while not response.endswith(b'{"status":"ok"}'):
                response += sock.recv(65536)
            assert response.startswith(b"HTTP/1.1 200 ")
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nhost: toolgate\r\nx-h: %s\r\n\r\n" % (b"a" * 80_000)
        )
        assert_refused(*answer(sock))


async def test_a_content_length_of_thousands_of_digits_is_judged_not_crashed_on(
    served: Instance,
) -> None:
    """Leading zeros reach the app as sent, too many for ``int``; the value is still a
    length: a small one is served (here: no token, 401), one over the limit refused at once
    (413)."""
    answers = []
    for length in (b"0" * 5000 + b"2", b"0" * 5000 + b"2000000"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(
                b"POST /propose HTTP/1.1\r\nhost: toolgate\r\nconnection: close\r\n"
                b"content-type: application/json\r\ncontent-length: " + length + b"\r\n\r\n{}"
            )
            answers.append(answer(sock))
    for (status, headers, body), expected in zip(answers, (401, 413), strict=True):
        assert status == expected, body
        assert headers["content-type"] == "application/problem+json"
    assert orjson.loads(answers[0][2])["code"] == "unauthenticated"
    assert orjson.loads(answers[1][2])["code"] == "invalid_request"


async def test_a_client_that_leaves_mid_body_is_no_server_error(
    env: dict[str, str], auth: Auth, tmp_path: Path
) -> None:
    """A body cut short by a closed connection, or never sent after ``100 Continue``: the
    client is gone, so nothing is answered, nothing is logged as an error, and the request
    is counted with status 499."""
    log = tmp_path / "serve.log"
    instance = Instance(env, log)
    try:
        await instance.ready()
        body = orjson.dumps({"tool": "get_order", "arguments": {"order_id": "ord_1"}})
        head = (
            "POST /propose HTTP/1.1\r\nhost: toolgate\r\ncontent-type: application/json\r\n"
            f"authorization: {auth()['Authorization']}\r\ncontent-length: {len(body)}\r\n"
        ).encode()
        for extra, sent in ((b"", body[:-10]), (b"expect: 100-continue\r\n", b"")):
            with socket.create_connection(("127.0.0.1", instance.port), timeout=10) as sock:
                sock.sendall(head + extra + b"\r\n" + sent)
                time.sleep(0.3)
        async with httpx.AsyncClient(base_url=instance.url) as client:
            metrics = (await client.get("/metrics")).text
    finally:
        instance.stop()
    assert 'route="/propose",status="499"} 2.0' in metrics.replace('method="POST",', "")
    errors = [line for line in log.read_text().splitlines() if '"level":"ERROR"' in line]
    assert errors == []


WEBSOCKET_UPGRADE = (
    b" HTTP/1.1\r\nhost: toolgate\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
    b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
)


def first_answer(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of the first response on a connection that may stay open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line[15:]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), body


async def test_a_websocket_upgrade_is_answered_as_a_request_and_not_logged(
    env: dict[str, str], tmp_path: Path
) -> None:
    """toolgate serves no WebSocket. Handed to uvicorn's WebSocket protocol, an upgrade
    escaped this protocol's limits (one with a 9 KB path was never answered, its connection
    held open for good) and every attempt was logged, path and all, before authentication."""
    log = tmp_path / "stderr"
    served = Instance(env, log=log)
    try:
        await served.ready()
        for _ in range(50):  # start-up's own lines, which the log's thread may write late
            if b"CTRL+C to quit" in log.read_bytes():  # uvicorn's last line of start-up
                break
            await asyncio.sleep(0.1)
        started = log.read_bytes().count(b"\n")
        for path in (b"/x", b"/mcp", b"/" + b"a" * 9000):
            with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
                sock.sendall(b"GET " + path + WEBSOCKET_UPGRADE)
                status, body = first_answer(sock)
            assert (status, orjson.loads(body)["code"]) == (
                (405, "invalid_request") if path == b"/mcp" else (404, "not_found")
            )
        await asyncio.sleep(0.5)
        lines = [orjson.loads(line) for line in log.read_bytes().splitlines()[started:]]
        assert [line for line in lines if line["logger"].startswith("uvicorn")] == []
    finally:
        served.stop()


async def test_a_request_must_arrive_whole_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol under a real uvicorn on a real socket, with a short ``ARRIVAL_S``: a
    head or a body sent too slowly is cut off, and a request in two reads in time is not."""
    monkeypatch.setattr(protocol, "ARRIVAL_S", 0.5)
    gone: list[bytes] = []

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.append(body)
                return
            body, more = body + message.get("body", b""), message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async def sent_slowly(first: bytes, then: bytes | None) -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        writer.write(first)
        if then is not None:
            await asyncio.sleep(0.2)
            writer.write(then)
        answer = await asyncio.wait_for(reader.read(), 5)  # until the server closes
        writer.close()
        return answer, time.monotonic() - started

    head = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\nconnection: close\r\n"
    async with served_app(echo, http=protocol.LimitedHttpToolsProtocol, log_level="error") as url:
        port = int(url.rsplit(":", 1)[1])
        cut_head, after_head = await sent_slowly(head, None)
        cut_body, after_body = await sent_slowly(head + b"\r\n12345", None)
        whole, _ = await sent_slowly(head, b"\r\n1234567890")
    assert (cut_head, cut_body) == (b"", b"")
    assert 0.4 < after_head < 3
    assert 0.4 < after_body < 3
    assert gone == [b"12345"]  # the app reading the body saw the client gone
    assert whole.startswith(b"HTTP/1.1 200")
    assert b"\r\n1234567890\r\n" in whole


NOT_HTTP = {
    "length-not-a-number": b"POST /propose HTTP/1.1\r\ncontent-length: abc\r\n\r\n{}",
    "two-lengths": b"POST /propose HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
    "bad-chunk-size": b"POST /propose HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}",
    "nul-in-header": b"POST /execute HTTP/1.1\r\nidempotency-key: a\x00b\r\n\r\n",
    "bad-method": b"P@ST /propose HTTP/1.1\r\n\r\n",
    "non-ascii-path": b"GET /\xff HTTP/1.1\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", NOT_HTTP.values(), ids=NOT_HTTP.keys())
async def test_a_request_that_is_not_http_is_answered_with_a_problem(
    served: Instance, request_bytes: bytes
) -> None:
    """What the HTTP server cannot parse was answered in plain text."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(request_bytes)
        status, headers, body = answer(sock)
    assert status == 400
    assert headers["content-type"] == "application/problem+json"
    assert orjson.loads(body)["code"] == "invalid_request"


def chunked_propose(token: bytes | None, trailer: bytes) -> bytes:
    body = orjson.dumps({"tool": "create_ticket", "arguments": {"subject": "s", "body": "b"}})
    return (
        b"POST /propose HTTP/1.1\r\nhost: toolgate\r\nconnection: close\r\n"
        b"content-type: application/json\r\ntransfer-encoding: chunked\r\n"
        + (b"authorization: " + token + b"\r\n" if token is not None else b"")
        + b"\r\n%x\r\n" % len(body)
        + body
        + b"\r\n0\r\n"
        + trailer
    )


async def test_a_trailer_field_is_not_taken_for_a_header(served: Instance, auth: Auth) -> None:
    """A proxy in front checks the head; a token, or a second one, sent after the body
    must not be the one toolgate acts on."""
    token = auth()["Authorization"].encode()
    answers = []
    for head_token, trailer in ((None, token), (token, auth(sub="bob")["Authorization"].encode())):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(chunked_propose(head_token, b"authorization: " + trailer + b"\r\n\r\n"))
            answers.append(answer(sock))
    (status, _, body), (second, _, proposal) = answers
    assert (status, orjson.loads(body)["code"]) == (401, "unauthenticated")
    assert second == 200, proposal
    assert orjson.loads(proposal)["authorized_by"]["sub"] == "alice"


@pytest.mark.parametrize(
    ("start", "piece"),
    [(b"x-big: ", b"a" * 65536), (b"", b"x-t: %s\r\n" % (b"a" * 1000) * 64)],
    ids=["one-long-field", "many-fields"],
)
async def test_trailer_fields_are_limited_as_the_head_is(
    served: Instance, auth: Auth, start: bytes, piece: bytes
) -> None:
    """Trailers after a chunked body were kept without bound: a client could make a worker
    hold hundreds of megabytes in a second."""
    before = rss_kib(served.process.pid)
    token = auth()["Authorization"].encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(chunked_propose(token, start))
        sent = 0
        while sent < 64 * 1024 * 1024 and not select.select([sock], [], [], 0.05)[0]:
            sock.sendall(piece)
            sent += len(piece)
        assert_refused(*answer(sock))
    assert sent <= 4 * len(piece), "the server kept reading the trailers"
    assert rss_kib(served.process.pid) - before < 4 * 1024


async def test_a_large_body_in_chunks_of_odd_sizes_is_served(served: Instance, auth: Auth) -> None:
    """The trailer limit counts from the last chunk only: a body of many chunks, some far
    over the head limit, some of one byte, with extensions, is read whole."""
    body = orjson.dumps({"tool": "create_ticket", "arguments": {"subject": "s" * 900_000}})
    sizes = itertools.cycle((1, 7, 70_001, 3, 4093, 200_000))
    chunks, at = [], 0
    while at < len(body):
        size = min(next(sizes), len(body) - at)
        chunks.append(b"%x;ext=%d\r\n%s\r\n" % (size, at, body[at : at + size]))
        at += size
    token = auth()["Authorization"].encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(
            b"POST /propose HTTP/1.1\r\nhost: toolgate\r\nconnection: close\r\n"
            b"content-type: application/json\r\ntransfer-encoding: chunked\r\n"
            b"authorization: " + token + b"\r\n\r\n" + b"".join(chunks) + b"0\r\nx-t: 1\r\n\r\n"
        )
        status, _, answered = answer(sock)
    assert status == 422, answered
    assert orjson.loads(answered)["code"] == "invalid_arguments"


async def test_what_follows_an_upgrade_request_is_never_run_as_a_request() -> None:
    """httptools stops at the head of a request asking for an upgrade and parses what comes
    after it as new requests: a body sent after the head (a proxy's next write) ran as a
    request of its own, which a proxy sharing the connection would pair with the answer of
    someone else's request. The connection now ends once the upgrade request is answered."""
    paths: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        paths.append(scope["path"])
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    smuggled = b"GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n"
    answers = []
    async with served_app(app, http=protocol.LimitedHttpToolsProtocol, log_level="error") as url:
        port = int(url.rsplit(":", 1)[1])
        for upgrade in (b"websocket", b"h2c"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /upgrade HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: "
                + upgrade
                + b"\r\ncontent-length: %d\r\n\r\n" % len(smuggled)
            )
            await asyncio.sleep(0.2)
            writer.write(smuggled)
            answer = b""
            with contextlib.suppress(TimeoutError):  # kept open: read what came in a second
                while chunk := await asyncio.wait_for(reader.read(65536), 1):
                    answer += chunk
            answers.append((answer, reader.at_eof()))
            writer.close()
    assert paths == ["/upgrade", "/upgrade"]
    for answer, closed in answers:
        assert answer.count(b"HTTP/1.1") == 1
        assert b"connection: close\r\n" in answer
        assert closed
