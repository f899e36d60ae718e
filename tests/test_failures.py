"""Fail closed: unreachable providers, Redis or database trouble, and expired records."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.db import Database
from app.errors import Unavailable
from tests.conftest import OwnRedis, Providers, running_app
from tests.flows import ALICE, Auth, Flow, new_key

DEAD_PROVIDER_CATALOG = """
version: "dead-1"
providers:
  billing: {base_url: "${DEMO_PROVIDERS_URL}/billing", timeout_s: 1}
  dead: {base_url: "http://127.0.0.1:1", timeout_s: 1}
resources:
  order:
    provider: billing
    owner: {method: GET, path: "/orders/{id}/owner"}
tools:
  cancel_order:
    mutation: true
    provider: dead
    execute: {method: POST, path: "/orders/{order_id}/cancel"}
    impact: high
    approval: {approvers: [actor]}
    access: {roles: [support]}
    parameters:
      type: object
      additionalProperties: false
      required: [order_id]
      properties:
        order_id: {type: string, x-resource: order}
"""


async def test_an_unreachable_provider_releases_the_key_and_the_approval(
    env: dict[str, str],
    auth: Auth,
    tmp_path: Path,
    db: asyncpg.Connection,
    providers: Providers,
) -> None:
    (tmp_path / "dead.yaml").write_text(DEAD_PROVIDER_CATALOG)
    async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
        flow = Flow(client, auth)
        args = {"order_id": "ord_1"}
        proposal = await flow.propose("cancel_order", args)
        assert proposal["next"] == "approval"
        approval = await flow.approve(proposal["call_id"], None, ALICE)
        assert approval.status_code == 200, approval.text
        approval_id = approval.json()["approval_id"]
        key = new_key()
        for _ in range(2):
            response = await flow.execute("cancel_order", args, key, approval_id=approval_id)
            assert (response.status_code, response.json()["code"]) == (502, "provider_unavailable")
        other_key = await flow.execute("cancel_order", args, new_key(), approval_id=approval_id)
        assert other_key.json()["code"] == "provider_unavailable", "the approval was given back"
    assert await db.fetchval("SELECT count(*) FROM executions") == 0
    assert await db.fetchval("SELECT consumed_by FROM approvals WHERE id = $1", approval_id) is None
    codes = await db.fetch("SELECT code FROM audit_events WHERE event = 'failed'")
    assert [r["code"] for r in codes] == ["provider_unavailable"] * 3


async def test_an_unsent_request_whose_record_was_taken_over_gives_nothing_back(
    env: dict[str, str],
    auth: Auth,
    tmp_path: Path,
    db: asyncpg.Connection,
    providers: Providers,
) -> None:
    """Between the claim and an unreachable provider's refusal, another request took the
    record over (its lock lapsed: it marked the record ``unknown`` and may have sent). The
    first request must not give back the approval the record holds, nor say that nothing
    ran: 504, status unknown, and the approval stays used. The take-over is made here by a
    trigger that stores each new record as ``unknown``."""
    (tmp_path / "dead.yaml").write_text(DEAD_PROVIDER_CATALOG)
    await db.execute(
        """
        CREATE FUNCTION taken_over() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN NEW.state := 'unknown'; RETURN NEW; END $$;
        CREATE TRIGGER taken_over BEFORE INSERT ON executions
        FOR EACH ROW EXECUTE FUNCTION taken_over();
        """
    )
    try:
        async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
            flow = Flow(client, auth)
            args = {"order_id": "ord_1"}
            proposal = await flow.propose("cancel_order", args)
            approval = await flow.approve(proposal["call_id"], None, ALICE)
            approval_id = approval.json()["approval_id"]
            response = await flow.execute("cancel_order", args, new_key(), approval_id=approval_id)
    finally:
        await db.execute("DROP TRIGGER taken_over ON executions; DROP FUNCTION taken_over()")
    assert (response.status_code, response.json()["code"]) == (504, "provider_timeout")
    assert await db.fetchval("SELECT state FROM executions") == "unknown"
    consumed = await db.fetchval("SELECT consumed_by FROM approvals WHERE id = $1", approval_id)
    assert consumed is not None, "the approval was given back while its record may have run"


NOTE_TOOL = """
  {name}:
    mutation: true
    provider: dead
    execute: {{method: POST, path: "/notes"}}
    impact: {impact}
    cost: 1
    approval: {{approvers: [actor]}}
    access: {{roles: [support]}}
    parameters:
      type: object
      additionalProperties: false
      required: [text]
      properties:
        text: {{type: string}}
"""
DEAD_NOTE_CATALOG = (
    """
version: "dead-2"
providers:
  dead: {base_url: "http://127.0.0.1:1", timeout_s: 1}
tools:"""
    + NOTE_TOOL.format(name="add_note", impact="low")
    + NOTE_TOOL.format(name="close_note", impact="high")
)


async def _waits_on_a_lock(db: asyncpg.Connection, pid: int | None = None) -> None:
    """Until a backend (``pid``, or any waiting on an advisory lock) waits on a lock."""
    for _ in range(200):
        if pid is None:
            sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            if await db.fetchval(sql):
                return
        elif await db.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        ):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("nothing waited on a lock")


async def _raced_by_an_execute(
    db: asyncpg.Connection,
    database_url: str,
    when: str,
    call_id: str,
    run_id: str,
    request: Coroutine[Any, Any, httpx.Response],
) -> httpx.Response:
    """``request``'s answer, its transaction held (by a trigger) just after it changed the
    run's row so ``when``, while a stand-in for a parallel execute of ``call_id`` takes the
    locks an execute's admission takes: the call's row, then the run's. Raises what
    PostgreSQL answers either side if the two deadlock."""
    await db.execute(
        f"""
        CREATE FUNCTION held() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$;
        CREATE TRIGGER held AFTER UPDATE ON runs
        FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION held();
        """
    )
    gate, execute = await asyncpg.connect(database_url), await asyncpg.connect(database_url)

    async def parallel() -> None:
        async with execute.transaction():
            await execute.fetchval("SELECT state FROM calls WHERE id = $1 FOR UPDATE", call_id)
            await execute.execute("UPDATE runs SET calls = calls WHERE id = $1", run_id)

    try:
        await gate.execute("SELECT pg_advisory_lock(4242)")
        sent = asyncio.create_task(request)
        await _waits_on_a_lock(db)  # the request is held, the run's row locked
        other = asyncio.create_task(parallel())
        await _waits_on_a_lock(db, execute.get_server_pid())
        await gate.execute("SELECT pg_advisory_unlock(4242)")
        response = await sent
        await other  # not aborted as a deadlock's victim
        return response
    finally:
        await gate.close()
        await execute.close()
        await db.execute("DROP TRIGGER held ON runs; DROP FUNCTION held()")


async def _proposed_in_a_run(flow: Flow, tool: str) -> tuple[str, str]:
    """(run_id, call_id) of ``tool`` proposed in a new run."""
    run_id = (await flow.post("/runs", {})).json()["run_id"]
    body = {"tool": tool, "arguments": {"text": "t"}, "run_id": run_id}
    return run_id, (await flow.post("/propose", body)).json()["call_id"]


async def test_an_unsent_call_is_released_without_deadlocking_a_parallel_execute_of_it(
    env: dict[str, str], auth: Auth, tmp_path: Path, db: asyncpg.Connection, database_url: str
) -> None:
    """Giving an unsent call's run cost back and its state back takes the call's row and the
    run's. A parallel execute of the same call (another key) takes them call first, then run
    (``recording.counts_as_call``); a release taking the run first deadlocked with it, and
    PostgreSQL aborted one of the two. Here the release is held just after its refund."""
    (tmp_path / "dead.yaml").write_text(DEAD_NOTE_CATALOG)
    async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
        flow = Flow(client, auth)
        run_id, call_id = await _proposed_in_a_run(flow, "add_note")
        send = flow.execute("add_note", {"text": "t"}, new_key(), call_id=call_id)
        response = await _raced_by_an_execute(
            db, database_url, "NEW.cost < OLD.cost", call_id, run_id, send
        )
    assert (response.status_code, response.json()["code"]) == (502, "provider_unavailable")
    assert await db.fetchval("SELECT count(*) FROM executions") == 0
    assert await db.fetchval("SELECT cost FROM runs WHERE id = $1", run_id) == 0
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == "proposed"


async def test_an_execute_by_approval_alone_does_not_deadlock_a_parallel_execute_of_its_call(
    env: dict[str, str], auth: Auth, tmp_path: Path, db: asyncpg.Connection, database_url: str
) -> None:
    """An execute naming only its approval charges the call's run and marks the call
    started. Taking the run first and the call second deadlocked with an execute naming the
    call (call first, then run); here the first is held just after its run's charge."""
    (tmp_path / "dead.yaml").write_text(DEAD_NOTE_CATALOG)
    async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
        flow = Flow(client, auth)
        run_id, call_id = await _proposed_in_a_run(flow, "close_note")
        approval = await flow.approve(call_id, None, ALICE)
        approval_id = approval.json()["approval_id"]
        send = flow.execute("close_note", {"text": "t"}, new_key(), approval_id=approval_id)
        response = await _raced_by_an_execute(
            db, database_url, "NEW.cost > OLD.cost", call_id, run_id, send
        )
    assert (response.status_code, response.json()["code"]) == (502, "provider_unavailable")
    assert await db.fetchval("SELECT count(*) FROM executions") == 0
    assert await db.fetchval("SELECT consumed_by FROM approvals WHERE id = $1", approval_id) is None
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == "approved"


async def test_redis_down_fails_mutations_closed(
    env: dict[str, str], auth: Auth, providers: Providers, db: asyncpg.Connection
) -> None:
    async with running_app({**env, "TOOLGATE_REDIS_URL": "redis://127.0.0.1:1/0"}) as client:
        flow = Flow(client, auth)
        response = await flow.execute("create_ticket", {"subject": "s", "body": "b"}, new_key())
        assert (response.status_code, response.json()["code"]) == (503, "unavailable")
        ready = await client.get("/readyz")
        assert (ready.status_code, ready.json()["checks"]["redis"]) == (503, "unreachable")
    assert (await providers.stats())["effects"] == 0
    assert await db.fetchval("SELECT count(*) FROM executions") == 0


async def test_after_a_redis_restart_the_next_mutation_reconnects_and_runs_once(
    env: dict[str, str],
    auth: Auth,
    providers: Providers,
    db: asyncpg.Connection,
    own_redis: OwnRedis,
) -> None:
    """Every pooled connection died with the old server; one transparent reconnect, not a
    503. With Redis really gone the mutation still fails closed before the provider."""
    args = {"subject": "s", "body": "b"}
    async with running_app({**env, "TOOLGATE_REDIS_URL": own_redis.url}) as client:
        flow = Flow(client, auth)
        before = await flow.execute("create_ticket", args, new_key())
        assert before.status_code == 200, before.text
        await own_redis.restart()
        after = await flow.execute("create_ticket", args, new_key())
        assert after.status_code == 200, after.text
        assert after.json()["status"] == "succeeded"
        assert (await providers.stats())["effects"] == 2
        await own_redis.stop()
        down = await flow.execute("create_ticket", args, key := new_key())
        assert (down.status_code, down.json()["code"]) == (503, "unavailable")
        assert down.headers["content-type"] == "application/problem+json"
    assert (await providers.stats())["effects"] == 2
    assert len([r for r in await providers.requests() if r["method"] == "POST"]) == 2
    assert await db.fetchval("SELECT count(*) FROM executions WHERE idempotency_key = $1", key) == 0


async def test_a_lost_database_answers_503_not_an_allow(
    env: dict[str, str], auth: Auth, providers: Providers
) -> None:
    async with running_app(env) as client:
        state = client._transport.app.state.toolgate  # type: ignore[attr-defined]
        await state.db.close()
        response = await client.post(
            "/execute",
            json={"tool": "get_order", "arguments": {"order_id": "ord_1"}},
            headers=auth(),
        )
        assert (response.status_code, response.json()["code"]) == (503, "unavailable")
        assert (await client.get("/readyz")).status_code == 503


@pytest.mark.parametrize("block", ["connection", "transaction"])
async def test_a_connection_lost_inside_a_block_is_unavailable_and_the_pool_serves_on(
    database: Database, block: str
) -> None:
    with pytest.raises(Unavailable):
        async with getattr(database, block)() as conn:
            await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    async with database.connection() as conn:
        assert await conn.fetchval("SELECT 1") == 1


async def test_a_transaction_cancelled_again_during_its_rollback_is_not_given_back_open(
    database: Database,
) -> None:
    """A task cancelled in a statement, and again while its ROLLBACK waits: the connection,
    still inside the transaction, is closed rather than returned to the pool (where asyncpg
    would log an error on taking it back), and the pool serves on."""
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context["message"]))
    try:

        async def slow() -> None:
            async with database.transaction() as conn:
                await conn.execute("SELECT pg_sleep(1)")

        task = asyncio.create_task(slow())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with database.connection() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        loop.set_exception_handler(None)
    assert errors == []


async def test_expired_records_are_purged_and_their_key_may_be_used_again(
    client: httpx.AsyncClient,
    auth: Auth,
    providers: Providers,
    db: asyncpg.Connection,
    app: object,
) -> None:
    from app.calls import store

    flow = Flow(client, auth)
    key = new_key()
    args = {"subject": "s", "body": "b"}
    assert (await flow.execute("create_ticket", args, key)).json()["status"] == "succeeded"
    await db.execute("UPDATE executions SET expires_at = now() - interval '1 second'")
    again = await flow.execute("create_ticket", args, key)
    assert "Idempotent-Replayed" not in again.headers
    assert again.json()["status"] == "succeeded"
    assert (await providers.stats())["effects"] == 2
    await db.execute("UPDATE executions SET expires_at = now() - interval '1 second'")
    async with app.state.toolgate.db.transaction() as conn:  # type: ignore[attr-defined]
        assert await store.purge_expired(conn, 1000) == 1
    assert await db.fetchval("SELECT count(*) FROM executions") == 0


KEPT_ALIVE_CATALOG = """
version: "kept-alive-1"
providers:
  flaky: {base_url: "http://127.0.0.1:${FLAKY_PORT}", timeout_s: 2}
resources:
  thing:
    provider: flaky
    owner: {method: GET, path: "/things/{id}/owner"}
tools:
  set_thing:
    mutation: true
    provider: flaky
    execute: {method: ${METHOD}, path: "/things/{thing_id}/set"}
    access: {roles: [support]}
    parameters:
      type: object
      additionalProperties: false
      required: [thing_id]
      properties:
        thing_id: {type: string, x-resource: thing}
"""


class CrashingProvider:
    """A provider that answers the owner lookup on a kept-alive connection, then performs
    the mutation that comes on that same connection and goes away without answering: it
    drops the connection and stops listening, as a provider that crashes right after
    acting. Started again on the same port, it deduplicates on ``Idempotency-Key`` as
    providers must: a key it has acted on is answered, not acted on again."""

    def __init__(self) -> None:
        self.effects = 0
        self.keys: list[str] = []
        """The ``Idempotency-Key`` of every mutation request that reached it."""
        self.port = 0
        self.crashed = False
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.crashed = False
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.server is not None
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                headers = {
                    k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
                }
                await reader.readexactly(int(headers.get("content-length", 0)))
                if "/set" in lines[0]:
                    key = headers["idempotency-key"]
                    self.keys.append(key)
                    if self.keys.count(key) == 1:
                        self.effects += 1
                        self.crashed = True
                        self.server.close()
                        writer.close()
                        return
                    body = b'{"id": "th_1", "replayed": true}'
                else:
                    body = b'{"tenant": "acme", "user": "alice"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "POST"])
async def test_a_mutation_dropped_after_it_reached_the_provider_is_unknown_whatever_its_method(
    env: dict[str, str], auth: Auth, tmp_path: Path, db: asyncpg.Connection, method: str
) -> None:
    """The HTTP client would send a request of an idempotent method (``GET``, ``PUT``,
    ``DELETE``) again over a new connection when the first drops before the answer; that
    reconnect failing made the first send look unsent, freeing the key (and the approval)
    for a second effect under a new operation id. A mutation is sent once: the provider
    may have acted, so the outcome is unknown (504) and the key kept; the client's retry
    with the same key sends the same operation id, which the provider deduplicates."""
    provider = CrashingProvider()
    port = await provider.start()
    catalog = KEPT_ALIVE_CATALOG.replace("${METHOD}", method)
    (tmp_path / "flaky.yaml").write_text(catalog)
    settings = {"TOOLGATE_CATALOG": str(tmp_path), "FLAKY_PORT": str(port)}
    key = new_key()
    try:
        async with running_app({**env, **settings}) as client:
            flow = Flow(client, auth)
            first = await flow.execute("set_thing", {"thing_id": "th_1"}, key)
            assert (first.status_code, first.json()["code"]) == (504, "provider_timeout")
            assert first.json()["status"] == "unknown"
            assert await db.fetchval("SELECT state FROM executions") == "unknown"
            assert (provider.crashed, len(provider.keys)) == (True, 1)  # sent once, not twice

            await provider.start()
            retry = await flow.execute("set_thing", {"thing_id": "th_1"}, key)
    finally:
        await provider.stop()
    assert retry.status_code == 200, retry.text
    assert retry.json()["status"] == "succeeded"
    assert provider.effects == 1
    assert len(set(provider.keys)) == 1  # one operation id, sent twice, acted on once
    assert await db.fetchval("SELECT count(*) FROM executions") == 1
