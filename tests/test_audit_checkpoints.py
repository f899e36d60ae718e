"""Signed checkpoints on real PostgreSQL: a database writer who rewrites the audit chain (and
its head) is caught by ``toolgate audit verify --checkpoints`` against the checkpoints the
sealer published, and, where the database alone can tell, by verify and the sealer itself."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from app.audit import sealer, service
from app.audit.chain import row_hash
from app.audit.checkpoints import SigningKey
from app.audit.models import AuditRow
from app.audit.service import verify
from app.db import Database
from app.settings import Settings
from tests.conftest import cli
from tests.test_audit_chain import (
    AUDIT_ROWS,
    FORGE_UNDER_SEQ,
    LATER,
    connect,
    insert,
    unsealed,
    wait_until_sealed,
)


@dataclass
class Setup:
    url: str
    conn: asyncpg.Connection
    database: Database
    key: SigningKey
    key_file: Path
    public_file: Path
    published: Path

    def settings(self, **variables: str) -> Settings:
        return Settings.from_env(
            {
                "TOOLGATE_DATABASE_URL": self.url,
                "TOOLGATE_AUDIT_SIGNING_KEY": str(self.key_file),
                "TOOLGATE_AUDIT_CHECKPOINT_FILE": str(self.published),
                **variables,
            }
        )


def key_files(directory: Path, name: str) -> tuple[SigningKey, Path, Path]:
    key = SigningKey.generate()
    key.save(directory / f"{name}.pem")
    (directory / f"{name}.pub.pem").write_text(key.public.pem())
    return key, directory / f"{name}.pem", directory / f"{name}.pub.pem"


@pytest.fixture
async def setup(lone_database: str, tmp_path: Path) -> AsyncIterator[Setup]:
    """A database no test app seals, a signing key, and where checkpoints are published."""
    key, key_file, public_file = key_files(tmp_path, "audit")
    conn = await connect(lone_database)
    database = Database(lone_database)
    await database.open(min_size=1, max_size=2)
    yield Setup(
        lone_database, conn, database, key, key_file, public_file, tmp_path / "published.ndjson"
    )
    await database.close()
    await conn.close()


def published(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def seal_and_publish(setup: Setup, batches: list[int]) -> list[dict[str, object]]:
    """Run the sealer as the app does while ``batches`` of rows arrive, each batch sealed and
    its checkpoint published (at most one a second) before the next."""
    task = sealer.start(setup.database, setup.settings())
    total = 0
    try:
        for count in batches:
            async with setup.conn.transaction():
                await insert(setup.conn, count)
            total += count
            await wait_until_sealed(setup.conn, total)
            deadline = time.monotonic() + 3 * sealer.PUBLISH_EVERY_S
            while [c["chain_pos"] for c in published(setup.published)][-1:] != [total]:
                assert time.monotonic() < deadline, published(setup.published)
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return published(setup.published)


async def audit_verify(
    setup: Setup, public_file: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``toolgate audit verify`` as an auditor runs it: checkpoints and public key, no
    signing key."""
    return await asyncio.to_thread(
        cli,
        "audit",
        "verify",
        "--checkpoints",
        str(setup.published),
        "--public-key",
        str(public_file or setup.public_file),
        TOOLGATE_DATABASE_URL=setup.url,
    )


async def as_attacker(
    conn: asyncpg.Connection, *statements: str, args: tuple[object, ...] = ()
) -> None:
    """A database writer going around the append-only trigger."""
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        for sql in statements:
            await conn.execute(sql, *args[: sql.count("$")])


async def rows_in_chain_order(conn: asyncpg.Connection) -> list[AuditRow]:
    records = await conn.fetch(f"{AUDIT_ROWS} ORDER BY s.chain_pos")
    return [AuditRow(**dict(r)) for r in records]


async def rehash(conn: asyncpg.Connection, rows: list[AuditRow]) -> None:
    """Recompute every hash from the first row on and move the head to the end: what a
    writer who knows the hashing rule does after editing."""
    prev = rows[0].prev_hash or ""
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        for row in rows:
            new = row_hash(row, prev)
            await conn.execute(
                "UPDATE audit_seals SET prev_hash = $1, hash = $2 WHERE seq = $3",
                prev,
                new,
                row.seq,
            )
            await conn.execute(
                "UPDATE audit_events SET reason = $1 WHERE seq = $2", row.reason, row.seq
            )
            prev = new
        await conn.execute(
            "UPDATE audit_chain SET chain_pos = $1, hash = $2, sealed_through = $3",
            rows[-1].chain_pos,
            prev,
            max(r.seq for r in rows),
        )


async def roll_back_tail_with_head(setup: Setup, first: dict[str, object]) -> None:
    """Cut the rows sealed after the first checkpoint and restore that checkpoint as the
    head, signature and all (it was published, so the writer has it)."""
    await as_attacker(
        setup.conn,
        "DELETE FROM audit_events WHERE seq IN (SELECT seq FROM audit_seals WHERE chain_pos > $1)",
        "DELETE FROM audit_seals WHERE chain_pos > $1",
        args=(first["chain_pos"],),
    )
    await as_attacker(
        setup.conn,
        "UPDATE audit_chain SET chain_pos = $1, hash = $2, sealed_through = $3,"
        " updated_at = $4::text::timestamptz, key_id = $5, signature = $6",
        args=tuple(
            first[k] for k in ("chain_pos", "hash", "sealed_through", "at", "key_id", "signature")
        ),
    )


async def edit_and_recompute(setup: Setup, first: dict[str, object]) -> None:
    rows = await rows_in_chain_order(setup.conn)
    rows[1] = AuditRow(**{**rows[1].__dict__, "reason": "nothing happened"})
    await rehash(setup.conn, rows[1:])


async def append_forged_row(setup: Setup, first: dict[str, object]) -> None:
    await insert(setup.conn, 1)
    rows = await rows_in_chain_order(setup.conn)
    assert rows[-2].chain_pos is not None
    forged = AuditRow(**{**rows[-1].__dict__, "chain_pos": rows[-2].chain_pos + 1})
    await as_attacker(
        setup.conn,
        "INSERT INTO audit_seals (seq, at, chain_pos, prev_hash, hash)"
        " SELECT seq, at, $1, $2, $3 FROM audit_events WHERE seq = $4",
        args=(forged.chain_pos, rows[-2].hash, row_hash(forged, rows[-2].hash or ""), forged.seq),
    )
    await as_attacker(
        setup.conn,
        "UPDATE audit_chain SET chain_pos = $1, hash = $2, sealed_through = $3",
        args=(forged.chain_pos, row_hash(forged, rows[-2].hash or ""), forged.seq),
    )


async def truncate_everything(setup: Setup, first: dict[str, object]) -> None:
    await setup.conn.execute(
        "TRUNCATE audit_events, audit_seals, audit_chain, audit_gaps RESTART IDENTITY"
    )


Attack = Callable[[Setup, dict[str, object]], Awaitable[None]]


@pytest.mark.parametrize(
    ("attack", "database_alone_tells", "named"),
    [
        (roll_back_tail_with_head, False, "short of the checkpoint on line 2"),
        (edit_and_recompute, True, "moved without the key"),
        (append_forged_row, True, "moved without the key"),
        (truncate_everything, False, "the chain ends at position 0"),
    ],
)
async def test_a_rewritten_chain_fails_verification_against_the_published_checkpoints(
    setup: Setup, attack: Attack, database_alone_tells: bool, named: str
) -> None:
    checkpoints = await seal_and_publish(setup, [3, 3])
    assert [c["chain_pos"] for c in checkpoints] == [3, 6]
    before = await audit_verify(setup)
    assert before.returncode == 0, before.stdout + before.stderr

    await attack(setup, checkpoints[0])

    after = await audit_verify(setup)
    assert after.returncode == 1, after.stdout + after.stderr
    assert "BROKEN" in after.stdout
    assert named in after.stdout
    assert "Traceback" not in after.stderr
    report = await verify(setup.database, setup.key.public)
    assert report.ok is not database_alone_tells


async def test_an_untouched_chain_verifies_signed_against_its_checkpoints(setup: Setup) -> None:
    checkpoints = await seal_and_publish(setup, [2, 3])
    assert all(c["key_id"] == setup.key.public.key_id for c in checkpoints)
    result = await audit_verify(setup)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "intact" in result.stdout
    assert f"signed by key {setup.key.public.key_id}" in result.stdout
    assert "checked 2 exported checkpoints" in result.stdout
    report = await verify(setup.database, setup.key.public)
    assert (report.ok, report.signed, report.key_id, report.checked) == (
        True,
        True,
        setup.key.public.key_id,
        5,
    )


async def test_the_sealers_log_lines_serve_as_checkpoints_too(setup: Setup, tmp_path: Path) -> None:
    await seal_and_publish(setup, [2])
    log_lines = tmp_path / "log.ndjson"
    lines = [
        json.dumps({"time": "t", "level": "INFO", "message": "audit checkpoint", **c})
        for c in published(setup.published)
    ]
    log_lines.write_text("\n".join(lines) + "\n")
    result = await asyncio.to_thread(
        cli,
        "audit",
        "verify",
        "--checkpoints",
        str(log_lines),
        "--public-key",
        str(setup.public_file),
        TOOLGATE_DATABASE_URL=setup.url,
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_a_wrong_public_key_fails_verification(setup: Setup, tmp_path: Path) -> None:
    await seal_and_publish(setup, [2])
    _, _, other = key_files(tmp_path, "other")
    result = await audit_verify(setup, public_file=other)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert "signed by key" in result.stdout


async def test_a_forged_checkpoint_line_fails_verification(setup: Setup) -> None:
    checkpoints = await seal_and_publish(setup, [2])
    forged = {**checkpoints[0], "chain_pos": 1}
    setup.published.write_text(json.dumps(forged) + "\n")
    result = await audit_verify(setup)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the checkpoint on line 1" in result.stdout
    assert "is not signed by key" in result.stdout


CHECKPOINT = {
    "chain_pos": 1,
    "hash": "sha256:" + "0" * 64,
    "sealed_through": 1,
    "at": "2026-01-01T00:00:00.000000Z",
    "key_id": None,
    "signature": None,
}


@pytest.mark.parametrize(
    "line",
    [
        '{"chain_pos": "three"}',
        json.dumps({**CHECKPOINT, "chain_pos": 2**63}),
        json.dumps({**CHECKPOINT, "chain_pos": 2**64 - 1}),
        json.dumps({**CHECKPOINT, "chain_pos": 2**70}),
        json.dumps({**CHECKPOINT, "chain_pos": -1}),
        json.dumps({**CHECKPOINT, "chain_pos": 1.0}),
        json.dumps({**CHECKPOINT, "chain_pos": True}),
        json.dumps({**CHECKPOINT, "sealed_through": 2**63}),
    ],
    ids=[
        "text",
        "2**63",
        "2**64-1",
        "2**70",
        "negative",
        "a_float",
        "a_bool",
        "sealed_through_2**63",
    ],
)
async def test_a_malformed_checkpoint_file_is_refused_clearly(setup: Setup, line: str) -> None:
    """Exit 2 (cannot check), never 1 (broken) from a query the file's numbers failed."""
    await insert(setup.conn, 1)
    setup.published.write_text(json.dumps(CHECKPOINT) + "\n" + line + "\n")
    result = await audit_verify(setup)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "line 2: not a checkpoint" in result.stderr
    assert "Traceback" not in result.stderr
    assert await unsealed(setup.conn) == 1  # refused before anything was done


async def test_the_sealer_refuses_to_extend_a_head_it_did_not_sign(
    setup: Setup, tmp_path: Path
) -> None:
    await insert(setup.conn, 3)
    await sealer.seal_all(setup.database, key=setup.key)
    rows = await rows_in_chain_order(setup.conn)
    rows[0] = AuditRow(**{**rows[0].__dict__, "reason": "edited"})
    await rehash(setup.conn, rows)
    await insert(setup.conn, 1)

    refused = await sealer.seal_pending(setup.database, key=setup.key)
    assert refused.sealed == 0
    assert refused.refused is not None
    assert "moved without the key" in refused.refused
    other, _, _ = key_files(tmp_path, "other")
    for key in (other, None):
        result = await sealer.seal_pending(setup.database, key=key)
        assert (result.sealed, result.refused is not None) == (0, True)
    assert await unsealed(setup.conn) == 1
    report = await verify(setup.database, setup.key.public)
    assert report.ok is False
    assert report.first_broken is not None
    assert "moved without the key" in report.first_broken.reason


async def test_a_signed_head_is_not_extended_by_a_sealer_without_the_key(setup: Setup) -> None:
    await insert(setup.conn, 2)
    await sealer.seal_all(setup.database, key=setup.key)
    await insert(setup.conn, 1)
    result = await sealer.seal_pending(setup.database)
    assert result.sealed == 0
    assert result.refused is not None
    assert "holds no key" in result.refused
    assert (await sealer.seal_pending(setup.database, key=setup.key)).sealed == 1
    report = await verify(setup.database, setup.key.public)
    assert (report.ok, report.signed, report.checked) == (True, True, 3)


async def test_an_unsigned_chain_is_signed_from_the_first_keyed_seal_on(setup: Setup) -> None:
    await insert(setup.conn, 2)
    await sealer.seal_all(setup.database)
    report = await verify(setup.database, setup.key.public)
    assert (report.ok, report.signed, report.key_id) == (True, False, None)
    await insert(setup.conn, 1)
    await sealer.seal_all(setup.database, key=setup.key)
    report = await verify(setup.database, setup.key.public)
    assert (report.ok, report.signed, report.key_id) == (True, True, setup.key.public.key_id)


async def test_rows_sealed_outside_the_chain_or_missing_below_sealed_through_fail_verify(
    setup: Setup,
) -> None:
    await insert(setup.conn, 3)
    await sealer.seal_all(setup.database)
    await insert(setup.conn, 1)
    await as_attacker(
        setup.conn,
        "INSERT INTO audit_seals (seq, at, chain_pos, prev_hash, hash)"
        " SELECT seq, at, 0, 'x', 'sha256:00' FROM audit_events WHERE seq = 4",
    )
    report = await verify(setup.database)
    assert report.first_broken is not None
    assert "not in the chain" in report.first_broken.reason
    await as_attacker(
        setup.conn,
        "DELETE FROM audit_seals WHERE seq = 4",
        "UPDATE audit_chain SET sealed_through = 4",
    )
    report = await verify(setup.database)
    assert report.first_broken is not None
    assert "neither sealed nor recorded as skipped" in report.first_broken.reason


@pytest.mark.parametrize(
    "forgery",
    [
        (
            "INSERT INTO audit_seals (seq, at, chain_pos, prev_hash, hash)"
            " VALUES (1000000, now(), 2, 'x', 'sha256:00')",
        ),
        (  # a forged row, shown as sealed at a position the next page skips
            "INSERT INTO audit_events (seq, event, tenant, actor) VALUES"
            " (1000, 'proposed', 'acme', 'mallory')",
            "INSERT INTO audit_seals (seq, at, chain_pos, prev_hash, hash)"
            " SELECT seq, at, 2, 'x', 'sha256:00' FROM audit_events WHERE seq = 1000",
        ),
    ],
    ids=["a_seal_without_its_row", "a_second_seal_at_a_pages_last_position"],
)
async def test_a_stray_seal_inside_the_chain_fails_verify(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, forgery: tuple[str, ...]
) -> None:
    monkeypatch.setattr(service, "VERIFY_PAGE", 2)
    await insert(setup.conn, 4)
    await sealer.seal_all(setup.database)
    await as_attacker(setup.conn, *forgery)
    report = await verify(setup.database)
    assert report.first_broken is not None
    assert "not in the chain" in report.first_broken.reason


async def test_a_row_added_under_a_sealed_seq_fails_verify_against_the_checkpoints(
    setup: Setup,
) -> None:
    """Signed head, published checkpoints, every hash intact: the added row is none of
    them, and ``toolgate audit verify`` names it all the same."""
    await seal_and_publish(setup, [3])
    await setup.conn.execute(FORGE_UNDER_SEQ, 2, LATER)
    assert await unsealed(setup.conn) == 1
    result = await audit_verify(setup)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "neither sealed nor inside a recorded gap" in result.stdout
    assert "Traceback" not in result.stderr
    assert await unsealed(setup.conn) == 1, "its verify's sealing pass did not take it in"


async def test_without_a_key_the_sealer_warns_that_checkpoints_are_unsigned(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    task = sealer.start(setup.database, Settings.from_env({"TOOLGATE_DATABASE_URL": setup.url}))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert any(
        r.levelname == "WARNING" and "checkpoints are unsigned" in r.getMessage()
        for r in caplog.records
    )


async def test_keygen_writes_a_private_key_once_and_prints_its_public_key(tmp_path: Path) -> None:
    out = tmp_path / "signing.pem"
    result = await asyncio.to_thread(cli, "audit", "keygen", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("-----BEGIN PUBLIC KEY-----")
    assert out.stat().st_mode & 0o777 == 0o600
    key = SigningKey.load(out)
    assert key.public.pem() == result.stdout
    assert key.public.key_id in result.stderr
    again = await asyncio.to_thread(cli, "audit", "keygen", "--out", str(out))
    assert again.returncode == 2
    assert "cannot write" in again.stderr
    assert SigningKey.load(out).public.key_id == key.public.key_id


async def test_a_signing_key_that_is_not_an_ed25519_key_is_refused_clearly(
    setup: Setup, tmp_path: Path
) -> None:
    not_a_key = tmp_path / "not-a-key.pem"
    not_a_key.write_text("hello\n")
    result = await asyncio.to_thread(
        cli,
        "audit",
        "verify",
        TOOLGATE_DATABASE_URL=setup.url,
        TOOLGATE_AUDIT_SIGNING_KEY=str(not_a_key),
    )
    assert result.returncode == 2
    assert "TOOLGATE_AUDIT_SIGNING_KEY" in result.stderr
    assert "Traceback" not in result.stderr
