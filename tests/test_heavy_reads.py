"""Heavy reads beside decisions: audit exports and verifications take turns in small steps,
rest between them while the worker serves decisions, hold nothing while a client is slow to
read, and a verification stops when its client leaves. Over real HTTP (the test app behind
uvicorn), so that a client going away is a closed connection."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import asyncpg
import httpx
import pytest

from app import load
from app.audit import sealer, service
from app.db import Database, Lock

Auth = Callable[..., dict[str, str]]
ROWS = 2000
"""Audit rows in the chain, of 10 kB each: an export of them (20 MB) is far more than a
socket with a small receive buffer and the server's send buffer hold. Verified one row per
slice, with a rest of at least ``HEAVY_PAUSE_S`` after each while the worker decides, they
take seconds."""


@pytest.fixture
async def long_chain(db: asyncpg.Connection, database: Database) -> None:
    await db.execute(
        "INSERT INTO audit_events (event, tenant, actor, arguments)"
        " SELECT 'proposed', 'acme', 'alice', jsonb_build_object('note', repeat('x', 10000))"
        " FROM generate_series(1, $1)",
        ROWS,
    )
    while (await sealer.seal_pending(database)).more or await db.fetchval(
        "SELECT count(*) FROM audit_seals"
    ) < ROWS:
        await asyncio.sleep(0.05)


async def verifiers(db: asyncpg.Connection) -> list[str]:
    """The states of the sessions holding the chain for a verification (``Lock.CHAIN``)."""
    rows = await db.fetch(
        "SELECT a.state FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
        " WHERE l.locktype = 'advisory' AND l.classid = 0 AND l.objid = $1 AND l.objsubid = 1"
        " AND l.granted AND a.datname = current_database()",
        int(Lock.CHAIN),
    )
    return [row["state"] for row in rows]


@pytest.mark.usefixtures("long_chain")
async def test_a_verification_holds_no_snapshot_and_stops_when_its_client_leaves(
    base_url: str, auth: Auth, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "VERIFY_SLICE", 1)
    headers = auth("audrey", "acme", "auditor")
    with load.deciding:  # as if decisions were being served all along: it rests
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
            verifying = asyncio.create_task(client.get("/audit/verify"))
            await asyncio.sleep(0.5)
            states = []
            for _ in range(20):  # walking the chain, between and during its page reads
                states += await verifiers(db)
                await asyncio.sleep(0.025)
            assert not verifying.done()
            assert len(states) == 20, states
            assert "idle in transaction" not in states, "a snapshot held across the walk"
            verifying.cancel()  # the client goes away: its connection closes
            left = time.monotonic()
            while await verifiers(db) and time.monotonic() - left < 5:
                await asyncio.sleep(0.02)
            stopped = time.monotonic() - left
    assert stopped < 1.0, f"the verification ran on for {stopped:.1f} s for nobody"


@pytest.mark.usefixtures("long_chain")
async def test_an_export_its_client_stopped_reading_holds_up_no_verification(
    base_url: str, auth: Auth
) -> None:
    headers = auth("audrey", "acme", "auditor")
    loop = asyncio.get_running_loop()
    host, port = base_url.removeprefix("http://").split(":")
    with socket.socket() as reader:  # a client that reads a little, then nothing
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        reader.setblocking(False)
        await loop.sock_connect(reader, (host, int(port)))
        request = f"GET /audit/export HTTP/1.1\r\nHost: {host}\r\n"
        request += f"Authorization: {headers['Authorization']}\r\n\r\n"
        await loop.sock_sendall(reader, request.encode())
        assert (await loop.sock_recv(reader, 4096)).startswith(b"HTTP/1.1 200 ")
        await asyncio.sleep(0.5)  # the server's sends block on the full socket
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
            response = await asyncio.wait_for(client.get("/audit/verify"), 10)
    assert response.status_code == 200, response.text
    assert (response.json()["ok"], response.json()["checked"]) == (True, ROWS)


async def test_heavy_steps_rest_only_while_the_worker_decides() -> None:
    turns = service.Turns()
    async with turns.step():
        await asyncio.sleep(0.01)
    started = time.perf_counter()
    async with turns.step():  # idle: it only yields first, never rests the 0.2 s it would busy
        assert time.perf_counter() - started < service.REST_RATIO * 0.01 / 4
    with load.deciding:
        async with turns.step():
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        async with turns.step():
            assert time.perf_counter() - started >= service.REST_RATIO * 0.01
