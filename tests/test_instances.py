"""Behaviour that crosses processes: real ``toolgate serve`` instances sharing PostgreSQL and
Redis, retried across instances, and killed mid-execution."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import Providers, children, exited, free_port
from tests.flows import Auth, Flow, new_key, refund_args
from tests.test_audit_chain import unsealed

REFUNDS = "/billing/refunds"


class Instance:
    def __init__(self, env: dict[str, str], log: Path | None = None) -> None:
        """``log``: a file for the server's log lines (stderr), else they are dropped."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("wb") if log is not None else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=self.log or subprocess.DEVNULL,
        )

    async def ready(self) -> None:
        deadline = time.monotonic() + 20
        async with httpx.AsyncClient(base_url=self.url) as client:
            while time.monotonic() < deadline:
                assert self.process.poll() is None, "toolgate exited during start-up"
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError("toolgate did not become ready")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.close()


@asynccontextmanager
async def two_instances(env: dict[str, str]) -> AsyncIterator[list[Instance]]:
    """Two ready instances with ``env``, stopped afterwards."""
    started = [Instance(env), Instance(env)]
    try:
        await asyncio.gather(*(i.ready() for i in started))
        yield started
    finally:
        for instance in started:
            instance.stop()


@pytest.fixture
async def instances(lock_env: dict[str, str]) -> AsyncIterator[list[Instance]]:
    """Two instances, sharing their locks through Redis or through PostgreSQL."""
    async with two_instances(lock_env) as started:
        yield started


@pytest.fixture
async def clients(instances: list[Instance]) -> AsyncIterator[list[httpx.AsyncClient]]:
    opened = [httpx.AsyncClient(base_url=i.url, timeout=30) for i in instances]
    yield opened
    for c in opened:
        await c.aclose()


async def effects(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def test_parallel_retries_across_two_instances_have_one_effect(
    clients: list[httpx.AsyncClient], auth: Auth, providers: Providers, client: httpx.AsyncClient
) -> None:
    flows = [Flow(c, auth) for c in clients]
    _, approval_id = await flows[0].approved_refund()
    key = new_key()
    responses = await asyncio.gather(
        *(
            flows[i % 2].execute("issue_refund", refund_args(), key, approval_id=approval_id)
            for i in range(24)
        )
    )
    assert {r.status_code for r in responses} <= {200, 409}
    assert any(r.status_code == 200 for r in responses)
    assert await effects(providers) == 1
    for flow in flows:
        replay = await flow.execute("issue_refund", refund_args(), key, approval_id=approval_id)
        assert replay.headers["Idempotent-Replayed"] == "true"
    assert await effects(providers) == 1


async def test_a_killed_instance_leaves_a_record_the_next_retry_reconciles(
    clients: list[httpx.AsyncClient],
    instances: list[Instance],
    auth: Auth,
    providers: Providers,
    db: asyncpg.Connection,
    client: httpx.AsyncClient,
) -> None:
    doomed, survivor = (Flow(c, auth) for c in clients)
    _, approval_id = await survivor.approved_refund()
    await providers.fault(REFUNDS, "stall_after_effect", seconds=5)
    key = new_key()
    inflight = asyncio.create_task(
        doomed.execute("issue_refund", refund_args(), key, approval_id=approval_id)
    )
    deadline = time.monotonic() + 10
    while await effects(providers) == 0:
        assert time.monotonic() < deadline, "the provider never saw the refund"
        await asyncio.sleep(0.01)
    os.kill(instances[0].process.pid, signal.SIGKILL)
    instances[0].process.wait()
    with pytest.raises(httpx.TransportError):
        await inflight
    assert await db.fetchval("SELECT state FROM executions") == "in_flight"
    deadline = time.monotonic() + 20
    while True:
        retry = await survivor.execute("issue_refund", refund_args(), key, approval_id=approval_id)
        if retry.status_code != 409:
            break
        assert retry.json()["code"] == "idempotency_in_flight"
        assert time.monotonic() < deadline, "the dead worker's lock never lapsed"
        await asyncio.sleep(0.5)
    assert retry.status_code == 200, retry.text
    assert (retry.json()["status"], retry.json()["provider_status"]) == ("succeeded", 201)
    assert await effects(providers) == 1
    assert await db.fetchval("SELECT state FROM executions") == "succeeded"
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'reconciled'") == 1


async def test_sighup_reloads_the_catalog_and_a_broken_one_is_refused(
    env: dict[str, str], tmp_path: Path
) -> None:
    catalog = tmp_path / "demo.yaml"
    original = Path(env["TOOLGATE_CATALOG"], "demo.yaml").read_text()
    catalog.write_text(original)
    instance = Instance({**env, "TOOLGATE_CATALOG": str(tmp_path)})
    try:
        await instance.ready()
        async with httpx.AsyncClient(base_url=instance.url) as c:
            before = (await c.get("/readyz")).json()["checks"]["catalog"]
            catalog.write_text(original.replace("demo-2026-11-29", "demo-reloaded"))
            instance.process.send_signal(signal.SIGHUP)
            for _ in range(50):
                after = (await c.get("/readyz")).json()["checks"]["catalog"]
                if after != before:
                    break
                await asyncio.sleep(0.1)
            assert after.startswith("demo-reloaded#")
            catalog.write_text("tools: [not, a, mapping")
            instance.process.send_signal(signal.SIGHUP)
            await asyncio.sleep(1)
            assert (await c.get("/readyz")).json()["checks"]["catalog"] == after
    finally:
        instance.stop()


async def test_serve_seals_in_a_process_of_its_own_and_stops_it(
    env: dict[str, str], lone_database: str, auth: Auth
) -> None:
    """Its workers seal nothing (``serve_app``); the sealer process beside them does, and
    ends with serve. The database is this test's own, so no other sealer can be at work."""
    instance = Instance({**env, "TOOLGATE_DATABASE_URL": lone_database})
    db = await asyncpg.connect(lone_database)
    try:
        await instance.ready()
        sealers = children(instance.process.pid)
        assert len(sealers) == 1, "serve (one worker) runs exactly one child: the sealer"
        async with httpx.AsyncClient(base_url=instance.url) as c:
            flow = Flow(c, auth)
            await flow.propose("get_order", {"order_id": "ord_1"})
            await flow.propose("get_order", {"order_id": "ord_2"})
        deadline = time.monotonic() + 5
        while await unsealed(db) != 0:
            assert time.monotonic() < deadline, "rows were not sealed"
            await asyncio.sleep(0.05)
        assert await db.fetchval("SELECT count(*) FROM audit_events") == 2
    finally:
        instance.stop()
        await db.close()
    deadline = time.monotonic() + 5
    while not exited(sealers[0]):
        assert time.monotonic() < deadline, "the sealer outlived serve"
        await asyncio.sleep(0.05)
