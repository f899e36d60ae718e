"""Retention: old history leaves in small batches, by one purger at a time, and the audit
chain left behind still verifies from its anchor. Against real PostgreSQL, through the app
for the rows a call leaves."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from app import retention
from app.audit import sealer
from app.audit.store import AuditEvent, append
from app.db import Database, Lock
from app.settings import ConfigError, Settings
from tests.flows import Flow, new_key

DAYS = 90


def kept(settings: Settings, audit_days: int = 0) -> Settings:
    return Settings.from_env(
        {
            **settings.env,
            "TOOLGATE_RETENTION_DAYS": str(DAYS),
            "TOOLGATE_AUDIT_RETENTION_DAYS": str(audit_days),
        }
    )


async def age(db: asyncpg.Connection, call_id: str, days: int) -> None:
    """As if the call and what hangs off it were made ``days`` ago."""
    for table, column in (("calls", "id"), ("dry_runs", "call_id"), ("approvals", "call_id")):
        await db.execute(
            f"UPDATE {table} SET created_at = created_at - make_interval(days => $2)"
            f" WHERE {column} = $1",
            call_id,
            days,
        )


async def counts(db: asyncpg.Connection) -> dict[str, int]:
    return {
        table: await db.fetchval(f"SELECT count(*) FROM {table}")
        for table in ("calls", "dry_runs", "approvals", "executions", "runs")
    }


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of two rows, so that every removal here takes several."""
    monkeypatch.setattr(retention, "BATCH", 2)


async def test_old_calls_leave_with_their_previews_and_approvals_in_small_batches(
    flow: Flow,
    db: asyncpg.Connection,
    database: Database,
    settings: Settings,
) -> None:
    old = []
    for amount in (150.0, 160.0, 170.0):
        proposal, _ = await flow.approved_refund(amount)
        old.append(proposal["call_id"])
    recent, _ = await flow.approved_refund(180.0)
    executed = await flow.execute("create_ticket", {"subject": "s", "body": "b"}, new_key())
    run = await flow.post("/runs", {"task": "t"})
    for call_id in [*old, executed.json()["call_id"]]:
        await age(db, call_id, DAYS + 1)
    await db.execute("UPDATE runs SET created_at = created_at - interval '91 days'")
    before = await counts(db)

    removed = await retention.purge(database, kept(settings), pause_s=0)

    assert removed == {"calls": 3, "runs": 1}
    after = await counts(db)
    assert after == {
        "calls": before["calls"] - 3,
        "dry_runs": before["dry_runs"] - 3,
        "approvals": before["approvals"] - 3,
        "executions": before["executions"],
        "runs": 0,
    }
    left = {r["id"] for r in await db.fetch("SELECT id FROM calls")}
    assert left == {recent["call_id"], executed.json()["call_id"]}, "its record still replays"
    assert run.status_code == 200
    assert await db.fetchval("SELECT count(*) FROM audit_events") > 0, "the audit trail stays"
    assert await retention.purge(database, kept(settings), pause_s=0) == {}


async def test_expired_execution_records_leave_in_batches_and_then_their_calls(
    flow: Flow,
    db: asyncpg.Connection,
    database: Database,
    settings: Settings,
) -> None:
    calls = []
    for _ in range(3):
        answer = await flow.execute("create_ticket", {"subject": "s", "body": "b"}, new_key())
        calls.append(answer.json()["call_id"])
        await age(db, calls[-1], DAYS + 1)
    await db.execute("UPDATE executions SET expires_at = now() - interval '1 second'")

    removed = await retention.purge(database, kept(settings), pause_s=0)

    assert removed == {"execution records": 3, "calls": 3}
    assert await counts(db) == dict.fromkeys(
        ("calls", "dry_runs", "approvals", "executions", "runs"), 0
    )


@pytest.mark.parametrize(
    ("held", "purged"),
    [(Lock.PURGER, None), (Lock.RECONCILER, {"calls": 1})],
    ids=["by_another_purger", "not_by_a_reconciler"],
)
async def test_one_purger_at_a_time(
    flow: Flow,
    db: asyncpg.Connection,
    database: Database,
    settings: Settings,
    database_url: str,
    held: Lock,
    purged: dict[str, int] | None,
) -> None:
    proposal = await flow.propose("get_order", {"order_id": "ord_1"})
    await age(db, proposal["call_id"], DAYS + 1)
    other = await asyncpg.connect(database_url)
    try:
        await other.execute("SELECT pg_advisory_lock($1)", held)
        assert await retention.purge(database, kept(settings), pause_s=0) == purged
        assert await db.fetchval("SELECT count(*) FROM calls") == (1 if purged is None else 0)
    finally:
        await other.close()
    if purged is None:
        assert await retention.purge(database, kept(settings), pause_s=0) == {"calls": 1}


def row(number: int) -> AuditEvent:
    return AuditEvent(event="proposed", tenant="acme", actor="alice", call_id=f"call_{number}")


async def sealed(database: Database) -> None:
    while (await sealer.seal_pending(database, grace_s=0.0)).busy:
        await asyncio.sleep(0.01)


async def test_audit_rows_are_kept_by_default(
    db: asyncpg.Connection, database: Database, settings: Settings
) -> None:
    await append(db, row(1))
    await sealed(database)
    far = datetime.now(UTC) + timedelta(days=10 * 365)
    assert await retention.purge(database, kept(settings), far, pause_s=0) == {}
    assert await db.fetchval("SELECT count(*) FROM audit_events") == 1


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"TOOLGATE_RETENTION_DAYS": "90", "TOOLGATE_AUDIT_RETENTION_DAYS": "30"}, "longest"),
        ({"TOOLGATE_RETENTION_DAYS": "0", "TOOLGATE_AUDIT_RETENTION_DAYS": "400"}, "longest"),
        ({"TOOLGATE_RETENTION_DAYS": "ninety"}, "whole number of days"),
        ({"TOOLGATE_WEBHOOK_RETENTION_DAYS": "-1"}, "whole number of days"),
        # now minus these is before the year 1: every pass would fail, nothing would expire
        ({"TOOLGATE_RETENTION_DAYS": "1000000"}, "whole number of days"),
        ({"TOOLGATE_AUDIT_RETENTION_DAYS": "1000000"}, "whole number of days"),
        ({"TOOLGATE_WEBHOOK_RETENTION_DAYS": "99999999999"}, "whole number of days"),
    ],
)
def test_retention_settings_that_would_lose_the_audit_trail_first_are_refused(
    variables: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(variables)


def test_retention_defaults_keep_the_audit_trail() -> None:
    settings = Settings.from_env({})
    assert (settings.retention_days, settings.audit_retention_days) == (90, 0)
    assert settings.webhook_retention_days == 7
