"""The audit trail by month on real PostgreSQL: old months dropped whole from the start of
the chain, archived first when configured, and ``toolgate audit verify --archive`` checking
the archive across the boundary; and a database with sealed rows migrated from 0014."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import stat
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import asyncpg
import orjson
import pytest

from app import retention
from app.audit import archive, chain, checkpoints, sealer, store
from app.audit.models import Anchor, Archived, AuditRow, ChainHead, Checkpoint
from app.audit.service import verify
from app.db import Database, Lock, migrate, migration_files
from app.settings import Settings
from tests.conftest import RUN, cli, fresh_database, running_app
from tests.flows import Auth
from tests.test_audit_chain import connect
from tests.test_audit_hash import row

NOW = datetime.now(UTC)
THIS_MONTH = NOW.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def months_ago(n: int) -> date:
    month = THIS_MONTH
    for _ in range(n):
        month = (month - timedelta(days=1)).replace(day=1)
    return month.date()


A, B, C = months_ago(5), months_ago(4), months_ago(3)


@dataclass
class Trail:
    url: str
    conn: asyncpg.Connection
    db: Database


@pytest.fixture
async def trail(lone_database: str) -> AsyncIterator[Trail]:
    """A database no app seals, with partitions for months A, B and C."""
    conn = await connect(lone_database)
    db = Database(lone_database)
    await db.open(min_size=1, max_size=3)
    for month in (A, B, C):
        await store.create_partitions(conn, month)
    yield Trail(lone_database, conn, db)
    await db.close()
    await conn.close()


async def write(conn: asyncpg.Connection, month: date, count: int, day: int = 10) -> None:
    """``count`` audit rows written in ``month`` (as bench/history.py writes old ones)."""
    first = datetime(month.year, month.month, day, tzinfo=UTC)
    for n in range(count):
        await conn.execute(
            "INSERT INTO audit_events (at, event, tenant, actor, call_id)"
            " VALUES ($1, 'proposed', 'acme', 'alice', $2)",
            first + timedelta(minutes=n),
            f"call_{month:%m}_{n}",
        )


async def seal(trail: Trail) -> None:
    await sealer.seal_all(trail.db, grace_s=0)


async def partitions(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent IN ('audit_events'::regclass, 'audit_seals'::regclass)"
    )
    return {r["relname"] for r in rows}


def named(month: date) -> set[str]:
    return {f"audit_events_{month:%Y_%m}", f"audit_seals_{month:%Y_%m}"}


async def published(trail: Trail) -> list[bytes]:
    """Every sealed row as the export publishes it, in chain order."""
    rows: list[AuditRow] = []
    async with trail.db.connection() as conn:
        while batch := await store.chain_page(conn, len(rows), 2**62, 100):
            rows += batch
    return [orjson.dumps(chain.item(r)) for r in rows]


def end_of(month: date) -> datetime:
    return archive.bounds(month)[1]


async def audit_verify(trail: Trail, directory: Path) -> tuple[int, str]:
    done = await asyncio.to_thread(
        cli, "audit", "verify", "--archive", str(directory), TOOLGATE_DATABASE_URL=trail.url
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


async def test_old_months_are_archived_dropped_and_verified_across_the_archive(
    trail: Trail, tmp_path: Path
) -> None:
    for month in (A, B, C):
        await write(trail.conn, month, 3)
    await seal(trail)
    items = await published(trail)

    removed = await archive.remove_months(trail.db, end_of(B), tmp_path, retention_days=1, key=None)

    assert removed == 6
    left = await partitions(trail.conn)
    assert not (named(A) | named(B)) & left
    assert named(C) <= left
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_events") == 3
    records = await trail.conn.fetch("SELECT * FROM audit_archives ORDER BY first_pos")
    assert [(r["month"], r["first_pos"], r["last_pos"], r["rows"]) for r in records] == [
        (A, 1, 3, 3),
        (B, 4, 6, 3),
    ]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [r["file"] for r in records]
    assert records[0]["prev_hash"] == chain.GENESIS
    assert records[1]["prev_hash"] == records[0]["last_hash"]
    contents = [(tmp_path / r["file"]).read_bytes() for r in records]
    assert b"".join(contents).splitlines() == items[:6], "exactly the export's items"
    anchor = await trail.conn.fetchrow("SELECT chain_pos, hash FROM audit_anchor")
    assert anchor is not None
    assert tuple(anchor) == (6, records[1]["last_hash"])
    report = await verify(trail.db)
    assert (report.ok, report.checked, report.removed_through) == (True, 3, 6), report
    # Rows past the anchor are still insert-only.
    for sql in ("DELETE FROM audit_events", "DELETE FROM audit_seals WHERE chain_pos = 7"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await trail.conn.execute(sql)

    code, out = await audit_verify(trail, tmp_path)
    assert code == 0, out
    assert "checked 6 archived rows in 2 files" in out

    # Anyone rewriting an archived row, even with its file's SHA-256 to match, is found.
    lines = contents[1].splitlines()
    edited = json.loads(lines[1]) | {"actor": "mallory"}
    forged = b"\n".join([lines[0], orjson.dumps(edited), *lines[2:]]) + b"\n"
    (tmp_path / records[1]["file"]).write_bytes(forged)
    code, out = await audit_verify(trail, tmp_path)
    assert code == 1, out
    assert "does not match its recorded SHA-256" in out
    await record_sha256(trail, forged)
    code, out = await audit_verify(trail, tmp_path)
    assert code == 1, out
    assert "position 5: the row's contents do not match its hash" in out

    # A line that is JSON but not a row (a list, a row without its hash) is a break too.
    for line in (b"[1]", orjson.dumps({k: v for k, v in edited.items() if k != "hash"})):
        forged = b"\n".join([lines[0], line, *lines[2:]]) + b"\n"
        (tmp_path / records[1]["file"]).write_bytes(forged)
        await record_sha256(trail, forged)
        code, out = await audit_verify(trail, tmp_path)
        assert code == 1, out
        assert "holds a line that is not an audit row" in out

    (tmp_path / records[0]["file"]).unlink()
    code, out = await audit_verify(trail, tmp_path)
    assert code == 1, out
    assert f"archive file {records[0]['file']} cannot be read" in out


async def record_sha256(trail: Trail, forged: bytes) -> None:
    """Forge month B's recorded SHA-256 to match ``forged``, as someone with write access to
    the database could (past the insert-only trigger)."""
    async with trail.conn.transaction():
        await trail.conn.execute("SET LOCAL session_replication_role = replica")
        await trail.conn.execute(
            "UPDATE audit_archives SET sha256 = encode(sha256($1), 'hex') WHERE month = $2",
            forged,
            B,
        )


async def test_without_an_archive_old_months_are_dropped_by_the_purger(
    trail: Trail, settings: Settings
) -> None:
    for month in (A, B):
        await write(trail.conn, month, 2)
    await seal(trail)
    kept = Settings.from_env(
        {
            **settings.env,
            "TOOLGATE_DATABASE_URL": trail.url,
            "TOOLGATE_RETENTION_DAYS": "30",
            "TOOLGATE_AUDIT_RETENTION_DAYS": "30",
        }
    )
    removed = await retention.purge(trail.db, kept, end_of(A) + timedelta(days=31), pause_s=0)

    assert removed == {"audit rows": 2}
    assert not named(A) & await partitions(trail.conn)
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_archives") == 0
    report = await verify(trail.db)
    assert (report.ok, report.checked, report.removed_through) == (True, 2, 2), report
    # The pass made the months ahead too.
    assert named(THIS_MONTH.date()) <= await partitions(trail.conn)


async def test_no_month_goes_while_a_verification_reads_the_chain(trail: Trail) -> None:
    for month in (A, B):
        await write(trail.conn, month, 2)
    await seal(trail)
    async with trail.db.sharing(Lock.CHAIN):  # what a verification holds while it walks
        assert (
            await archive.remove_months(trail.db, end_of(B), None, retention_days=1, key=None) == 0
        )
        assert named(A) <= await partitions(trail.conn)
    assert await archive.remove_months(trail.db, end_of(B), None, retention_days=1, key=None) == 4
    assert not (named(A) | named(B)) & await partitions(trail.conn)
    report = await verify(trail.db)
    assert (report.ok, report.checked, report.removed_through) == (True, 0, 4), report


async def test_a_month_with_unsealed_rows_stays_and_a_late_row_cuts_after_later_rows(
    trail: Trail, tmp_path: Path
) -> None:
    await write(trail.conn, A, 2)
    await write(trail.conn, B, 2)
    await seal(trail)
    await write(trail.conn, A, 1, day=20)  # committed late: sealed after B's rows

    assert (
        await archive.remove_months(trail.db, end_of(B), tmp_path, retention_days=1, key=None) == 0
    )
    assert named(A) <= await partitions(trail.conn)
    assert list(tmp_path.iterdir()) == []

    await seal(trail)
    # A's last row is at position 5, after B's two rows: the cut takes them along, so B's
    # month goes at position 5 with nothing left to archive.
    assert (
        await archive.remove_months(trail.db, end_of(A), tmp_path, retention_days=1, key=None) == 5
    )
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_events") == 0
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_seals") == 0
    assert named(B) <= await partitions(trail.conn)
    [record] = await trail.conn.fetch("SELECT first_pos, last_pos, rows FROM audit_archives")
    assert tuple(record) == (1, 5, 5)
    report = await verify(trail.db)
    assert (report.ok, report.removed_through, report.sealed_through) == (True, 5, 5), report
    assert (
        await archive.remove_months(trail.db, end_of(B), tmp_path, retention_days=1, key=None) == 0
    )
    assert not named(B) & await partitions(trail.conn)
    code, out = await audit_verify(trail, tmp_path)
    assert code == 0, out


async def test_an_archive_that_cannot_be_written_removes_nothing(
    trail: Trail, tmp_path: Path
) -> None:
    await write(trail.conn, A, 2)
    await seal(trail)
    blocked = tmp_path / "a-file"
    blocked.write_text("")

    assert (
        await archive.remove_months(
            trail.db, end_of(A), blocked / "archive", retention_days=1, key=None
        )
        == 0
    )

    assert named(A) <= await partitions(trail.conn)
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_events") == 2
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_archives") == 0
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_anchor") == 0
    assert (await verify(trail.db)).ok


async def test_an_archive_file_is_private_and_never_written_through_a_planted_link(
    trail: Trail, tmp_path: Path
) -> None:
    """An archive holds every tenant's rows, so only toolgate's user may read it; and its
    temporary name is predictable, so a link planted there by anyone who can write the
    directory must not make the purger overwrite the file it points at (a key, say)."""
    await write(trail.conn, A, 2)
    await seal(trail)
    victim = tmp_path / "audit-key.pem"
    victim.write_bytes(b"the signing key")
    directory = tmp_path / "archive"
    directory.mkdir()
    name = f"audit-{A:%Y-%m}-000000000001-000000000002.ndjson"
    (directory / f".{name}.partial").symlink_to(victim)

    assert (
        await archive.remove_months(trail.db, end_of(A), directory, retention_days=1, key=None) == 2
    )

    assert victim.read_bytes() == b"the signing key"
    assert [p.name for p in directory.iterdir()] == [name]
    written = directory / name
    assert not written.is_symlink()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert len(written.read_bytes().splitlines()) == 2


def archived_file(directory: Path, lines: list[bytes], last_hash: str) -> Archived:
    """An archive file of ``lines`` (positions 1 on) and its record."""
    content = b"".join(line + b"\n" for line in lines)
    (directory / "audit.ndjson").write_bytes(content)
    sha256 = hashlib.sha256(content).hexdigest()
    return Archived("audit.ndjson", A, 1, len(lines), chain.GENESIS, last_hash, len(lines), sha256)


def test_an_archive_file_is_checked_a_line_at_a_time(tmp_path: Path) -> None:
    """A month's archive can hold gigabytes: checking it holds a line in memory, not the
    file (nor every row of it parsed)."""
    rows = [row(seq, reason="x" * 50_000) for seq in range(1, 201)]
    sealed = chain.plan(ChainHead(0, chain.GENESIS, 0), rows, NOW, timedelta(0))
    lines = [
        orjson.dumps(
            chain.item(
                dataclasses.replace(r, chain_pos=s.chain_pos, prev_hash=s.prev_hash, hash=s.hash)
            )
        )
        for r, s in zip(rows, sealed.seals, strict=True)
    ]
    record = archived_file(tmp_path, lines, sealed.head.hash)
    assert (tmp_path / record.file).stat().st_size > 10_000_000

    tracemalloc.start()
    try:
        checked = archive.check(tmp_path, [record], Anchor(200, sealed.head.hash), set())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (checked.broken, checked.rows) == (None, 200)
    assert peak < 2_000_000, f"{peak} bytes held to check a file of 10 MB"


@pytest.mark.parametrize(
    "value",
    [b"1152921504606846976", b"[" * 900 + b"]" * 900],
    ids=["an integer JSON canonicalization refuses", "nesting too deep to canonicalize"],
)
def test_an_archived_line_no_row_could_be_is_named_not_a_crash(
    tmp_path: Path, value: bytes
) -> None:
    """Published rows never hold such values (``chain.item``); a file that does, even with
    its recorded SHA-256 forged to match, is a broken archive to report, not a traceback."""
    document = chain.item(row(1)) | {"hash": chain.GENESIS, "reason": None}
    line = orjson.dumps(document).replace(b'"reason":null', b'"reason":' + value)
    record = archived_file(tmp_path, [line], chain.GENESIS)

    checked = archive.check(tmp_path, [record], Anchor(1, chain.GENESIS), set())

    assert checked.broken is not None
    assert checked.broken.reason == (
        "archive file audit.ndjson holds a line that is not an audit row"
    )


@pytest.mark.parametrize("recorded", ["../elsewhere.ndjson", "{tmp}/elsewhere.ndjson", "fifo"])
def test_verify_reads_only_regular_files_of_the_archive_directory(
    tmp_path: Path, recorded: str
) -> None:
    """``audit_archives`` names the file: whoever can write the database must not make
    verify read another file (or vouch for a copy kept elsewhere), nor wait forever on a
    FIFO or a device such as ``/dev/zero``."""
    directory = tmp_path / "archive"
    directory.mkdir()
    document = chain.item(row(1)) | {"prev_hash": chain.GENESIS}
    line = orjson.dumps(document | {"hash": chain.row_hash(row(1), chain.GENESIS)})
    record = archived_file(tmp_path, [line], json.loads(line)["hash"])
    (tmp_path / record.file).rename(tmp_path / "elsewhere.ndjson")
    os.mkfifo(directory / "fifo")
    record = dataclasses.replace(record, file=recorded.format(tmp=tmp_path))
    anchor = Anchor(1, record.last_hash)

    checked = archive.check(directory, [record], anchor, set())

    assert checked.broken is not None
    assert checked.broken.reason == (
        f"archive file {record.file} is not a file of the archive directory"
    )


async def test_a_database_with_sealed_rows_migrates_from_0014_and_its_chain_still_verifies(
    admin_dsn: str,
) -> None:
    async with fresh_database(admin_dsn, f"toolgate_test_{RUN}_0014", migrated=False) as url:
        conn = await connect(url)
        try:
            await conn.execute(
                "CREATE TABLE schema_migrations (version text PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, path in migration_files():
                if version > "0014_~":
                    break
                await conn.execute(path.read_text())
                await conn.execute("INSERT INTO schema_migrations VALUES ($1)", version)
            old = datetime(A.year, A.month, 3, tzinfo=UTC)
            for at in (old, old + timedelta(hours=1), NOW):
                await conn.execute(
                    "INSERT INTO audit_events (at, event, tenant, actor) VALUES"
                    " ($1, 'proposed', 'acme', 'alice')",
                    at,
                )
            rows = [AuditRow(**dict(r)) for r in await conn.fetch("SELECT * FROM audit_events")]
            planned = chain.plan(ChainHead(0, chain.GENESIS, 0), rows, NOW, timedelta())
            for s in planned.seals:
                await conn.execute(
                    "UPDATE audit_events SET chain_pos = $1, prev_hash = $2, hash = $3,"
                    " sealed_at = now() WHERE seq = $4",
                    s.chain_pos,
                    s.prev_hash,
                    s.hash,
                    s.seq,
                )
            await conn.execute(
                "INSERT INTO audit_chain (chain_pos, hash, sealed_through) VALUES ($1, $2, $3)",
                *(planned.head.chain_pos, planned.head.hash, planned.head.sealed_through),
            )

            applied = await migrate(url)

            assert applied[:3] == [
                "0015_audit_seals",
                "0016_audit_partitions",
                "0017_decided_by_tool",
            ]
            assert named(A) | named(THIS_MONTH.date()) <= await partitions(conn)
            assert await conn.fetchval("SELECT count(*) FROM audit_seals") == 3
            db = Database(url)
            await db.open(min_size=1, max_size=2)
            try:
                report = await verify(db)
                assert (report.ok, report.checked, report.sealed_through) == (True, 3, 3)
                await conn.execute(
                    "INSERT INTO audit_events (event, tenant, actor) VALUES ('denied', 'a', 'b')"
                )
                await sealer.seal_all(db)
                assert (await verify(db)).checked == 4
            finally:
                await db.close()
        finally:
            await conn.close()


async def test_a_checkpoint_of_a_removed_position_newer_than_the_retention_fails_verify(
    trail: Trail, tmp_path: Path
) -> None:
    """A published checkpoint of a removed position betrays a cut made too early when it
    was signed inside the audit retention, which no rightful removal can be; without a
    retention configured, the one the signed start of the chain records is the rule."""
    key = checkpoints.SigningKey.generate()
    await write(trail.conn, A, 2)
    await write(trail.conn, B, 2)
    await sealer.seal_all(trail.db, grace_s=0, key=key)
    seals = await trail.conn.fetch("SELECT chain_pos, hash FROM audit_seals")
    hashes = {r["chain_pos"]: r["hash"] for r in seals}
    assert await archive.remove_months(trail.db, end_of(A), None, retention_days=30, key=key) == 2

    def signed_at(position: int, at: datetime) -> tuple[int, Checkpoint]:
        head = ChainHead(position, hashes[position], position)
        return (1, key.sign(head, chain.rfc3339(at)))

    rightful = signed_at(2, datetime(A.year, A.month, 10, 0, 1, tzinfo=UTC))
    hidden = signed_at(2, NOW - timedelta(days=20))
    kept = signed_at(3, NOW - timedelta(days=20))
    days = timedelta(days=30)
    report = await verify(trail.db, key.public, [rightful, kept], horizon=days)
    assert (report.ok, report.removed_through, report.first_broken) == (True, 2, None), report
    report = await verify(trail.db, key.public, [hidden])  # the anchor's own 30 days
    assert not report.ok, report
    report = await verify(trail.db, key.public, [kept, hidden], horizon=days)
    assert not report.ok, report
    assert report.first_broken is not None
    assert report.first_broken.chain_pos == 2
    assert "removed before their time" in report.first_broken.reason
    # A line no key vouches for cannot raise the alarm.
    unsigned = (1, dataclasses.replace(signed_at(1, NOW)[1], signature=None))
    assert (await verify(trail.db, key.public, [unsigned], horizon=days)).ok

    # `toolgate audit verify` judges by the instances' TOOLGATE_AUDIT_RETENTION_DAYS, or,
    # with none, by the retention the signed start of the chain records.
    published_file, public_file = tmp_path / "checkpoints.ndjson", tmp_path / "audit.pub"
    published_file.write_bytes(checkpoints.record(hidden[1]))
    public_file.write_text(key.public.pem())
    argv = (
        "audit",
        "verify",
        "--checkpoints",
        str(published_file),
        "--public-key",
        str(public_file),
    )
    done = await asyncio.to_thread(cli, *argv, TOOLGATE_DATABASE_URL=trail.url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "inside the 30-day audit retention" in done.stdout
    retention = {"TOOLGATE_RETENTION_DAYS": "30", "TOOLGATE_AUDIT_RETENTION_DAYS": "30"}
    done = await asyncio.to_thread(cli, *argv, TOOLGATE_DATABASE_URL=trail.url, **retention)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "removed before their time" in done.stdout


async def as_retention(conn: asyncpg.Connection, days: int, sql: str, *args: object) -> None:
    """``sql`` in a transaction that states the retention horizon, as retention's does."""
    async with conn.transaction():
        await conn.execute(
            "SELECT set_config('toolgate.audit_retention_days', $1, true)", str(days)
        )
        await conn.execute(sql, *args)


async def test_the_database_moves_the_start_of_the_chain_for_retention_only(
    trail: Trail,
) -> None:
    await write(trail.conn, A, 3)
    await seal(trail)
    start = await trail.conn.fetchrow("SELECT hash, at FROM audit_seals WHERE chain_pos = 2")
    assert start is not None
    insert = (
        "INSERT INTO audit_anchor (chain_pos, hash, at, outside_gaps, retention_days)"
        " VALUES (2, $1, $2, 2, $3)"
    )
    refused = asyncpg.InsufficientPrivilegeError
    with pytest.raises(refused):  # no retention stated
        await trail.conn.execute(insert, start["hash"], start["at"], None)
    with pytest.raises(refused):  # stated, but its rows are younger than that
        await as_retention(trail.conn, 400, insert, start["hash"], start["at"], 400)
    with pytest.raises(refused):  # a horizon stated, another one recorded
        await as_retention(trail.conn, 30, insert, start["hash"], start["at"], 1)
    with pytest.raises(refused):  # below a start that never moved, rows stay
        await trail.conn.execute("DELETE FROM audit_events WHERE seq = 1")
    assert await trail.conn.fetchval("SELECT count(*) FROM audit_anchor") == 0

    assert await archive.remove_months(trail.db, end_of(A), None, retention_days=30, key=None) == 3
    anchor = await store.anchor(trail.conn)
    assert (anchor.chain_pos, anchor.retention_days) == (3, 30)
    with pytest.raises(refused):
        await trail.conn.execute("DELETE FROM audit_anchor")
    with pytest.raises(refused):  # never back, even as retention
        await as_retention(trail.conn, 30, "UPDATE audit_anchor SET chain_pos = 1")


async def cut_past_the_guard(conn: asyncpg.Connection, through: int) -> None:
    """What a writer with the tables' owner rights can do: get past the anchor's trigger,
    move the start of the chain to ``through`` (counting the seqs it removes, so the
    accounting adds up) and delete the rows below it, which the delete triggers allow."""
    await conn.execute("ALTER TABLE audit_anchor DISABLE TRIGGER audit_anchor_moved_by_retention")
    await conn.execute(
        "INSERT INTO audit_anchor (chain_pos, hash, at, outside_gaps)"
        " SELECT chain_pos, hash, at, chain_pos FROM audit_seals WHERE chain_pos = $1",
        through,
    )
    await conn.execute("ALTER TABLE audit_anchor ENABLE TRIGGER audit_anchor_moved_by_retention")
    await conn.execute(
        "DELETE FROM audit_events e USING audit_seals s"
        " WHERE s.chain_pos <= $1 AND s.seq = e.seq AND s.at = e.at",
        through,
    )
    await conn.execute("DELETE FROM audit_seals WHERE chain_pos <= $1", through)


async def test_a_start_cut_without_retention_fails_verify_the_command_and_the_api(
    trail: Trail, tmp_path: Path, env: dict[str, str], auth: Auth
) -> None:
    """With no audit retention configured (the default), a writer moved the start of the
    chain over young rows and deleted them. Verify once passed it: it judged no checkpoint
    of a removed position without a retention to judge by, and the start was not signed."""
    key = checkpoints.SigningKey.generate()
    await write(trail.conn, C, 6)
    await sealer.seal_all(trail.db, grace_s=0, key=key)
    seals = await trail.conn.fetch("SELECT chain_pos, hash, at FROM audit_seals")
    exported = [
        (n, key.sign(ChainHead(r["chain_pos"], r["hash"], r["chain_pos"]), chain.rfc3339(r["at"])))
        for n, r in enumerate(sorted(seals, key=lambda r: r["chain_pos"]), start=1)
    ]
    assert (await verify(trail.db, key.public, exported)).ok
    await cut_past_the_guard(trail.conn, 4)

    unsigned = await verify(trail.db, key.public)
    assert not unsigned.ok
    assert unsigned.first_broken is not None
    assert "not signed by key" in unsigned.first_broken.reason
    keyless = await verify(trail.db, None, exported)
    assert not keyless.ok
    assert keyless.first_broken is not None
    assert "no audit retention allows removing rows" in keyless.first_broken.reason

    published_file, public_file = tmp_path / "checkpoints.ndjson", tmp_path / "audit.pub"
    published_file.write_bytes(b"".join(checkpoints.record(c) for _, c in exported))
    public_file.write_text(key.public.pem())
    for public in ([], ["--public-key", str(public_file)]):
        argv = ("audit", "verify", "--checkpoints", str(published_file), *public)
        done = await asyncio.to_thread(cli, *argv, TOOLGATE_DATABASE_URL=trail.url)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "BROKEN" in done.stdout
        assert "removed by retention" not in done.stdout

    key_file = tmp_path / "audit.key"
    key.save(key_file)
    served = {
        **env,
        "TOOLGATE_DATABASE_URL": trail.url,
        "TOOLGATE_AUDIT_SIGNING_KEY": str(key_file),
    }
    async with running_app(served) as client:
        answer = (
            await client.get("/audit/verify", headers=auth(sub="erin", roles="auditor"))
        ).json()
    assert (answer["ok"], answer["removed_through"], answer["anchor_signed"]) == (False, 4, False)


async def test_a_start_retention_cut_and_signed_verifies_and_a_forged_one_does_not(
    trail: Trail,
) -> None:
    key = checkpoints.SigningKey.generate()
    await write(trail.conn, A, 2)
    await write(trail.conn, B, 2)
    await sealer.seal_all(trail.db, grace_s=0, key=key)
    assert await archive.remove_months(trail.db, end_of(A), None, retention_days=30, key=key) == 2
    report = await verify(trail.db, key.public)
    assert (report.ok, report.removed_through, report.anchor_signed) == (True, 2, True), report
    assert "removed by retention, signed" in report.summary()
    # Another key's signature, or a start moved further on, is not retention's.
    other = checkpoints.SigningKey.generate()
    assert not (await verify(trail.db, other.public)).ok
    await trail.conn.execute(
        "ALTER TABLE audit_anchor DISABLE TRIGGER audit_anchor_moved_by_retention"
    )
    await trail.conn.execute("UPDATE audit_anchor SET chain_pos = 3")
    await trail.conn.execute(
        "ALTER TABLE audit_anchor ENABLE TRIGGER audit_anchor_moved_by_retention"
    )
    assert not (await verify(trail.db, key.public)).ok
