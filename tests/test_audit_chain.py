"""The audit chain on real PostgreSQL: append-only in the database, sealing after commit in
sequence order, verification naming the first broken row, and ``toolgate audit verify``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.audit import sealer, service
from app.audit.chain import GENESIS, row_hash
from app.audit.models import AuditRow
from app.audit.service import verify
from app.audit.store import AuditEvent, append
from app.db import Database
from tests.conftest import ROOT, cli, exited, running_app
from tests.flows import Flow, refund_args

Auth = Callable[..., dict[str, str]]
SEAL_BOUND_S = 5.0


def event(number: int, **fields: Any) -> AuditEvent:
    return AuditEvent(
        **{
            "event": "proposed",
            "tenant": "acme",
            "actor": "alice",
            "call_id": f"call_{number}",
            "tool": "issue_refund",
            "target": {"type": "order", "id": "ord_1"},
            "arguments": {"order_id": "ord_1", "amount": number},
            "decision": "allow",
            "policy_version": "v1#abc123",
            "proposed_by": "model",
            "total_ms": 2.5,
            **fields,
        }
    )


async def insert(db: asyncpg.Connection, count: int) -> None:
    for number in range(count):
        await append(db, event(number))


async def connect(url: str) -> asyncpg.Connection:
    """Another session, as the app opens them (JSON codec included)."""
    conn = await asyncpg.connect(url)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


async def one_pass(database: Database, grace_s: float) -> sealer.Pass:
    """A sealing pass, waiting out the app's background sealer if it holds the lock."""
    while True:
        result = await sealer.seal_pending(database, grace_s)
        if not result.busy:
            return result
        await asyncio.sleep(0.01)


AUDIT_ROWS = (
    "SELECT e.*, s.chain_pos, s.prev_hash, s.hash, s.sealed_at"
    " FROM audit_events e LEFT JOIN audit_seals s ON s.seq = e.seq AND s.at = e.at"
)
"""Audit rows with their chain columns (None until sealed), as ``AuditRow`` takes them."""


async def chain_order(db: asyncpg.Connection) -> list[int]:
    rows = await db.fetch("SELECT seq FROM audit_seals ORDER BY chain_pos")
    return [r["seq"] for r in rows]


async def unsealed(db: asyncpg.Connection) -> int:
    """Audit rows without a seal."""
    return int(
        await db.fetchval(
            "SELECT count(*) FROM audit_events e WHERE NOT EXISTS"
            " (SELECT 1 FROM audit_seals s WHERE s.seq = e.seq AND s.at = e.at)"
        )
    )


async def wait_until_sealed(db: asyncpg.Connection, expected: int) -> float:
    started = time.monotonic()
    while time.monotonic() - started < SEAL_BOUND_S:
        counts = await db.fetchrow(
            "SELECT count(*) AS rows, count(*) FILTER (WHERE s.seq IS NULL) AS unsealed"
            " FROM audit_events e LEFT JOIN audit_seals s ON s.seq = e.seq AND s.at = e.at"
        )
        assert counts is not None
        if counts["rows"] == expected and counts["unsealed"] == 0:
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"not sealed within {SEAL_BOUND_S} s: {counts!r}")


async def tamper(db: asyncpg.Connection, sql: str) -> None:
    """A DBA going around the trigger, inside one transaction of their own."""
    async with db.transaction():
        await db.execute("SET LOCAL session_replication_role = replica")
        await db.execute(sql)


def admin(auth: Auth) -> dict[str, str]:
    return auth("root", "ops", "admin")


async def test_rows_are_sealed_right_after_requests_and_the_chain_verifies(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    flow = Flow(client, auth)
    await flow.propose("get_order", {"order_id": "ord_1"})
    await flow.propose("issue_refund", refund_args(20))
    denied = await client.post(
        "/propose", json={"tool": "get_order", "arguments": {"order_id": "ord_9"}}, headers=auth()
    )
    assert denied.status_code == 403
    elapsed = await wait_until_sealed(db, 3)
    assert elapsed < 5 * sealer.EVERY_S, "sealed by the next passes, not much later"
    report = (await client.get("/audit/verify", headers=admin(auth))).json()
    assert report == {
        "ok": True,
        "checked": 3,
        "sealed_through": 3,
        "unsealed": 0,
        "skipped": 0,
        "first_broken": None,
        "stalled": 0,
        "signed": False,
        "key_id": None,
        "removed_through": 0,
        "anchor_signed": False,
    }
    items = (await client.get("/audit", headers=admin(auth))).json()["items"]
    assert [i["event"] for i in items] == ["proposed", "proposed", "denied"]
    assert items[0]["prev_hash"] == GENESIS
    assert [i["prev_hash"] for i in items[1:]] == [i["hash"] for i in items[:-1]]
    assert len({i["hash"] for i in items}) == 3


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE audit_events SET reason = 'nothing to see here' WHERE seq = 3",
        "UPDATE audit_events SET actor = 'mallory' WHERE seq = 3",
        # A row's time is in its seal too, which is found by it.
        "UPDATE audit_events SET at = at - interval '1 hour' WHERE seq = 3;"
        " UPDATE audit_seals SET at = at - interval '1 hour' WHERE seq = 3",
        """UPDATE audit_events SET arguments = '{"order_id": "ord_1", "amount": 2000}'"""
        " WHERE seq = 3",
        'UPDATE audit_events SET outcome = \'{"status": "succeeded"}\' WHERE seq = 3',
        "UPDATE audit_events SET provider_ms = 1 WHERE seq = 3",
        "UPDATE audit_seals SET prev_hash = 'sha256:' || repeat('1', 64) WHERE seq = 3",
    ],
)
async def test_a_row_edited_directly_in_sql_is_named_by_verify(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection, change: str
) -> None:
    await insert(db, 5)
    await wait_until_sealed(db, 5)
    await tamper(db, change)
    report = (await client.get("/audit/verify", headers=auth("audrey", "acme", "auditor"))).json()
    assert report["ok"] is False
    assert report["first_broken"]["seq"] == 3
    assert report["checked"] == 2


FORGE_UNDER_SEQ = """
    INSERT INTO audit_events (seq, at, event, call_id, tenant, actor, tool, decision, reason,
        approval_id, authorized_by)
    SELECT seq, at + $2::text::interval, 'approved', call_id,
        tenant, 'mallory', tool, 'allow', 'approved by phone', 'apr_forged',
        '{"sub": "mallory"}'
    FROM audit_events WHERE seq = $1
"""
"""A second row under a sealed ``seq``, at another time (``$2`` from the row it doubles):
a plain INSERT (no trigger to go around), which the primary key ``(seq, at)`` lets in."""
EARLIER, LATER = "-1 millisecond", "1 millisecond"


async def test_a_row_added_under_a_sealed_seq_is_named_by_verify(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    await insert(db, 5)
    await wait_until_sealed(db, 5)
    await db.execute(FORGE_UNDER_SEQ, 3, EARLIER)
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE seq = 3") == 2
    await asyncio.sleep(3 * sealer.EVERY_S)  # the app's sealer has had its passes
    assert await unsealed(db) == 1, "nothing seals it: the chain is past seq 3"
    report = (await client.get("/audit/verify", headers=auth("audrey", "acme", "auditor"))).json()
    assert report["ok"] is False
    assert report["first_broken"]["seq"] == 3
    assert "neither sealed nor inside a recorded gap" in report["first_broken"]["reason"]
    assert (report["checked"], report["sealed_through"]) == (5, 5)


@pytest.mark.parametrize("offset", [EARLIER, LATER])
@pytest.mark.parametrize("forged", [[1], [2], [2, 5], [4, 5]])
async def test_rows_under_sealed_seqs_are_counted_across_verify_pages(
    db: asyncpg.Connection,
    database: Database,
    monkeypatch: pytest.MonkeyPatch,
    forged: list[int],
    offset: str,
) -> None:
    """Pages of 2 rows: a forged row may fall either side of a page's end, before or after
    the row it doubles."""
    monkeypatch.setattr(service, "VERIFY_PAGE", 2)
    await insert(db, 5)
    await sealer.seal_all(database)
    assert (await verify(database)).ok is True
    for seq in forged:
        await db.execute(FORGE_UNDER_SEQ, seq, offset)
    assert await sealer.seal_all(database) == 0
    report = await verify(database)
    assert report.ok is False
    assert report.first_broken is not None
    assert report.first_broken.seq == forged[0]
    assert report.first_broken.reason.startswith(f"{len(forged)} rows up to seq 5 ")


async def test_a_sealed_row_rehashed_by_hand_breaks_the_link_to_the_next(
    db: asyncpg.Connection, database: Database
) -> None:
    await insert(db, 4)
    await sealer.seal_all(database)
    stored = await db.fetchrow(f"{AUDIT_ROWS} WHERE e.seq = 2")
    assert stored is not None
    row = AuditRow(**dict(stored))
    forged = AuditRow(**{**row.__dict__, "reason": "forged"})
    new_hash = row_hash(forged, row.prev_hash or "")
    await tamper(
        db,
        "UPDATE audit_events SET reason = 'forged' WHERE seq = 2;"
        f" UPDATE audit_seals SET hash = '{new_hash}' WHERE seq = 2",
    )
    report = await verify(database)
    assert report.first_broken is not None
    assert (report.first_broken.seq, report.checked) == (3, 2)
    assert "prev_hash" in report.first_broken.reason


async def test_a_deleted_row_is_a_hole_in_the_chain_not_a_gap(
    db: asyncpg.Connection, database: Database
) -> None:
    await insert(db, 5)
    await sealer.seal_all(database)
    await tamper(db, "DELETE FROM audit_events WHERE seq = 3")
    report = await verify(database)
    assert report.first_broken is not None
    assert (report.first_broken.seq, report.first_broken.chain_pos) == (4, 3)
    assert "position 3 is missing" in report.first_broken.reason
    assert report.skipped == 0


async def test_rows_cut_from_the_end_of_the_chain_are_noticed(
    db: asyncpg.Connection, database: Database
) -> None:
    await insert(db, 5)
    await sealer.seal_all(database)
    await tamper(db, "DELETE FROM audit_events WHERE seq >= 4")
    report = await verify(database)
    assert report.first_broken is not None
    assert (report.first_broken.seq, report.first_broken.chain_pos) == (None, 4)
    assert "removed from its end" in report.first_broken.reason
    assert report.checked == 3


async def test_the_database_refuses_update_and_delete_of_audit_rows(
    db: asyncpg.Connection, database: Database
) -> None:
    await insert(db, 2)
    await sealer.seal_all(database)
    await append(db, event(3))
    refused = [
        "UPDATE audit_events SET reason = 'edited' WHERE seq = 1",
        "UPDATE audit_seals SET hash = 'sha256:00', prev_hash = 'x' WHERE seq = 1",
        "UPDATE audit_seals SET chain_pos = 9 WHERE seq = 2",
        "UPDATE audit_events SET reason = 'edited' WHERE seq = 3",
        """UPDATE audit_events SET arguments = '{"x": 1}', run_id = 'run_x' WHERE seq = 3""",
        "DELETE FROM audit_events WHERE seq = 1",
        "DELETE FROM audit_events WHERE seq = 3",
        "DELETE FROM audit_events",
        "DELETE FROM audit_seals WHERE seq = 1",
        "DELETE FROM audit_seals",
    ]
    for sql in refused:
        table = sql.split()[2 if sql.startswith("DELETE") else 1]
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=table):
            await db.execute(sql)
    await sealer.seal_all(database)
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE reason = 'edited'") == 0
    assert (await verify(database)).ok
    await db.execute("TRUNCATE audit_events, audit_seals, audit_chain, audit_gaps")
    assert await db.fetchval("SELECT count(*) FROM audit_events") == 0


async def test_a_lower_seq_that_commits_after_a_higher_one_is_waited_for(
    database_url: str, db: asyncpg.Connection, database: Database
) -> None:
    slow = await connect(database_url)
    try:
        transaction = slow.transaction()
        await transaction.start()
        await append(slow, event(1))
        await append(db, event(2))
        result = await one_pass(database, grace_s=60)
        assert (result.sealed, result.waiting) == (0, True)
        await transaction.commit()
    finally:
        await slow.close()
    await sealer.seal_all(database, grace_s=60)
    assert await chain_order(db) == [1, 2]
    report = await verify(database)
    assert (report.ok, report.checked, report.sealed_through, report.skipped) == (True, 2, 2, 0)


async def test_a_rolled_back_seq_is_skipped_after_the_grace_period_and_recorded(
    db: asyncpg.Connection, database: Database
) -> None:
    await append(db, event(1))
    transaction = db.transaction()
    await transaction.start()
    await append(db, event(2))
    await transaction.rollback()
    await append(db, event(3))
    assert (await one_pass(database, grace_s=60)).waiting
    assert await chain_order(db) == [1]
    assert (await verify(database)).unsealed == 1
    result = await one_pass(database, grace_s=0)
    assert (result.sealed, result.waiting) == (1, False)
    assert await chain_order(db) == [1, 3]
    gaps = await db.fetch("SELECT first_seq, last_seq, after_pos FROM audit_gaps")
    assert [tuple(g) for g in gaps] == [(2, 2, 1)]
    report = await verify(database)
    assert (report.ok, report.checked, report.sealed_through, report.skipped) == (True, 2, 3, 1)
    assert report.unsealed == 0


async def test_a_skipped_seq_that_commits_late_joins_the_end_of_the_chain(
    database_url: str, db: asyncpg.Connection, database: Database
) -> None:
    slow = await connect(database_url)
    try:
        transaction = slow.transaction()
        await transaction.start()
        await append(slow, event(1))
        await append(db, event(2))
        assert (await one_pass(database, grace_s=0)).sealed == 1
        gaps = await db.fetch("SELECT first_seq, last_seq, after_pos FROM audit_gaps")
        assert [tuple(g) for g in gaps] == [(1, 1, 0)]
        assert (await verify(database)).skipped == 1
        await append(db, event(3))
        assert (await one_pass(database, grace_s=0)).sealed == 1
        await transaction.commit()
    finally:
        await slow.close()
    waiting = await verify(database)  # a late row inside a gap waits; nothing was added
    assert (waiting.ok, waiting.first_broken, waiting.unsealed) == (True, None, 1)
    await sealer.seal_all(database, grace_s=0)
    assert await chain_order(db) == [2, 3, 1]
    report = await verify(database)
    assert (report.ok, report.checked, report.sealed_through, report.skipped) == (True, 3, 3, 0)


async def test_concurrent_writes_from_two_instances_end_in_one_valid_chain(
    client: httpx.AsyncClient, env: dict[str, str], auth: Auth, db: asyncpg.Connection
) -> None:
    async with running_app(env) as other:
        flows = [Flow(client, auth), Flow(other, auth)]
        await asyncio.gather(
            *(flows[i % 2].propose("get_order", {"order_id": "ord_1"}) for i in range(60))
        )
        await wait_until_sealed(db, 60)
    order = await chain_order(db)
    assert sorted(order) == list(range(1, 61))
    positions = await db.fetch("SELECT chain_pos FROM audit_seals ORDER BY chain_pos")
    assert [p["chain_pos"] for p in positions] == list(range(1, 61))
    report = (await client.get("/audit/verify", headers=admin(auth))).json()
    assert (report["ok"], report["checked"], report["unsealed"]) == (True, 60, 0)


STAND_IN = """
import time
from app.audit import sealer
print(sealer.spawn().pid, flush=True)
time.sleep(120)
"""


async def test_the_sealer_process_seals_and_ends_when_its_parent_is_killed(
    lone_database: str, tmp_path: Any
) -> None:
    """``toolgate serve``'s sealer process: it seals what is committed, and a ``kill -9`` of
    serve (no cleanup runs) does not leave it behind."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    db = await connect(lone_database)
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "TOOLGATE_DATABASE_URL": lone_database},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(await asyncio.wait_for(asyncio.to_thread(parent.stdout.readline), 30))
        await insert(db, 3)
        await wait_until_sealed(db, 3)
        assert not exited(child)
    finally:
        parent.kill()
        parent.communicate()
        await db.close()
    deadline = time.monotonic() + 10 * sealer.EVERY_S
    while not exited(child) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert exited(child), "the sealer outlived its parent"


async def test_the_cli_seals_verifies_and_exits_non_zero_naming_the_broken_row(
    database_url: str, db: asyncpg.Connection
) -> None:
    await insert(db, 4)
    intact = await asyncio.to_thread(cli, "audit", "verify", TOOLGATE_DATABASE_URL=database_url)
    assert intact.returncode == 0, intact.stderr
    assert "intact" in intact.stdout
    assert "checked 4 sealed rows" in intact.stdout
    assert await unsealed(db) == 0
    await tamper(db, "UPDATE audit_events SET tenant = 'globex' WHERE seq = 2")
    broken = await asyncio.to_thread(cli, "audit", "verify", TOOLGATE_DATABASE_URL=database_url)
    assert broken.returncode == 1, broken.stderr
    assert "BROKEN" in broken.stdout
    assert "first broken row: seq 2" in broken.stdout
    base = Path(tempfile.mkdtemp(prefix="toolgate-data-"))  # see conftest.embedded_server
    try:
        embedded = await asyncio.to_thread(cli, "audit", "verify", TOOLGATE_DATA_DIR=str(base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert embedded.returncode == 0, embedded.stderr  # no URL: the embedded store, empty
    assert "checked 0 sealed rows" in embedded.stdout


async def test_verify_answers_json_for_scripts_and_no_progress_when_piped(
    database_url: str, db: asyncpg.Connection
) -> None:
    await insert(db, 4)
    intact = await asyncio.to_thread(
        cli, "audit", "verify", "--json", TOOLGATE_DATABASE_URL=database_url
    )
    assert intact.returncode == 0, intact.stderr
    told = json.loads(intact.stdout)
    assert (told["ok"], told["checked"], told["first_broken"]) == (True, 4, None)
    assert "\r" not in intact.stderr
    assert "verifying" not in intact.stderr
    await tamper(db, "UPDATE audit_events SET tenant = 'globex' WHERE seq = 2")
    broken = await asyncio.to_thread(
        cli, "audit", "verify", "--json", TOOLGATE_DATABASE_URL=database_url
    )
    assert broken.returncode == 1, broken.stderr
    told = json.loads(broken.stdout)
    assert (told["ok"], told["first_broken"]["seq"]) == (False, 2)
    nowhere = await asyncio.to_thread(
        cli, "audit", "verify", "--json", TOOLGATE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/x"
    )
    assert nowhere.returncode == 2, nowhere.stderr
    assert json.loads(nowhere.stdout)["ok"] is False
    assert json.loads(nowhere.stdout)["error"]


async def test_verify_shows_its_progress_on_a_terminal(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Run with standard error on a terminal (a pseudo-terminal here), verify draws rows
    done, of how many and the rate; standard output keeps only the report."""
    await insert(db, 4)
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLGATE_", "DEMO_"))}
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "app.cli", "audit", "verify"],
            cwd=ROOT,
            env={**env, "TOOLGATE_DATABASE_URL": database_url, "TERM": "xterm"},
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=60,
        )
        os.close(follower)
        drawn = b""
        with contextlib.suppress(OSError):  # the terminal's end, once the child has exited
            while chunk := os.read(leader, 65536):
                drawn += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0
    assert "intact" in done.stdout
    assert "\r" not in done.stdout
    assert "verifying the chain: 4 of 4 (100%)" in drawn.decode()
