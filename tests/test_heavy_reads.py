"""Heavy reads beside decisions: a worker runs one audit export or verification at a time,
resting between steps while it serves decisions, and a verification stops when its client
leaves. Over real HTTP (the test app behind uvicorn), so that a client going away is a
closed connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg
import httpx
import pytest

from app import load
from app.audit import sealer, service
from app.db import Database

Auth = Callable[..., dict[str, str]]
ROWS = 2000
"""Audit rows in the chain: verified one row per slice, with a rest of at least
``HEAVY_PAUSE_S`` after each while the worker decides, a verification takes seconds."""


@pytest.fixture
async def long_chain(db: asyncpg.Connection, database: Database) -> None:
    await db.execute(
        "INSERT INTO audit_events (event, tenant, actor)"
        " SELECT 'proposed', 'acme', 'alice' FROM generate_series(1, $1)",
        ROWS,
    )
    while (await sealer.seal_pending(database)).more or await db.fetchval(
        "SELECT count(*) FROM audit_seals"
    ) < ROWS:
        await asyncio.sleep(0.05)


@pytest.mark.usefixtures("long_chain")
async def test_an_export_waits_for_a_verification_that_runs_until_its_client_leaves(
    base_url: str, auth: Auth, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "VERIFY_SLICE", 1)  # several seconds, resting after each row
    monkeypatch.setattr(service, "EXPORT_PAGE", ROWS + 1)  # the export itself is one page
    headers = auth("audrey", "acme", "auditor")
    with load.deciding:  # as if decisions were being served all along
        await _verify_left_for_an_export(base_url, headers)
    snapshots = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'idle in transaction'"
    )
    assert snapshots == 0


async def _verify_left_for_an_export(base_url: str, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as verifier:
        verifying = asyncio.create_task(verifier.get("/audit/verify"))
        await asyncio.sleep(0.3)
        assert not verifying.done()
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as exporter:
            exporting = asyncio.create_task(exporter.get("/audit/export"))
            await asyncio.sleep(0.5)
            assert not exporting.done()  # its turn comes after the verification's
            verifying.cancel()  # the verifying client goes away: its connection closes
            left = time.monotonic()
            export = await exporting
            waited = time.monotonic() - left
    assert export.status_code == 200
    assert len(export.text.splitlines()) == ROWS
    assert waited < 1.0, f"the export waited {waited:.1f} s for a verification for nobody"


@pytest.mark.usefixtures("long_chain")
async def test_a_verification_its_client_waits_for_still_answers(base_url: str, auth: Auth) -> None:
    headers = auth("audrey", "acme", "auditor")
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        response = await client.get("/audit/verify")
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["ok"], report["checked"]) == (True, ROWS)


async def test_heavy_reads_rest_only_while_the_worker_decides() -> None:
    paced = service.Paced()
    await _busy_for(0.01)
    started = time.perf_counter()
    await paced.rest()
    assert time.perf_counter() - started < service.HEAVY_PAUSE_S  # idle: it only yields
    with load.deciding:
        await _busy_for(0.01)
        started = time.perf_counter()
        await paced.rest()
        assert time.perf_counter() - started >= service.REST_RATIO * 0.01


async def _busy_for(seconds: float) -> None:
    """A step that took ``seconds`` (a sleep: the rest is measured from the step's start)."""
    await asyncio.sleep(seconds)
