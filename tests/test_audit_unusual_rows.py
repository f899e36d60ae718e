"""Stored JSON the fast decoder, JCS or the encoders cannot take (numbers beyond any range,
nesting beyond any request's), written straight into the database as an older version or a
hand-made row would have: it must not stop sealing, reading or verifying the audit trail
for every tenant."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import asyncpg
import httpx
import pytest

from app.audit import sealer
from app.audit.service import STALL_S, verify
from app.db import Database
from tests.conftest import cli
from tests.test_audit_chain import event, insert, wait_until_sealed

Auth = Callable[..., dict[str, str]]
HUGE = "4" * 400
BEYOND_PYTHON = "7" * 5000
DEEP = "[" * 300 + "]" * 300
DEEPER_THAN_ORJSON = "[" * 1100 + "]" * 1100
UNUSUAL = {
    "400_digits": f'{{"order_id": "ord_1", "amount": {HUGE}}}',
    "5000_digits": f'{{"order_id": "ord_1", "amount": -{BEYOND_PYTHON}}}',
    "beyond_double": '{"order_id": "ord_1", "amount": 1e400}',
    "nested_300": f'{{"order_id": "ord_1", "note": {DEEP}}}',
    "nested_1100": f'{{"order_id": "ord_1", "note": {DEEPER_THAN_ORJSON}}}',
}


async def insert_unusual(db: asyncpg.Connection, call_id: str, arguments: str) -> None:
    """A denied call's audit row as a version that stored raw arguments as given wrote it."""
    await db.execute(
        "INSERT INTO audit_events (event, tenant, actor, call_id, tool, arguments, decision,"
        " code, reason, policy_version, proposed_by)"
        " VALUES ('denied', 'acme', 'alice', $1, 'issue_refund', $2::text::jsonb, 'deny',"
        " 'invalid_arguments', 'amount is not a number', 'v1#abc123', 'model')",
        call_id,
        arguments,
    )


def admin(auth: Auth) -> dict[str, str]:
    return auth("root", "ops", "admin")


async def test_unusual_rows_are_sealed_listed_exported_and_verified_with_the_rest(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection, database_url: str
) -> None:
    await insert(db, 2)
    for name, arguments in UNUSUAL.items():
        await insert_unusual(db, f"call_{name}", arguments)
    await insert(db, 2)
    rows = 4 + len(UNUSUAL)
    await wait_until_sealed(db, rows)

    listing = await client.get("/audit", headers=admin(auth))
    assert listing.status_code == 200
    items = {i["call_id"]: i for i in listing.json()["items"]}
    assert len(items) == rows - 2  # event() reuses call ids 0 and 1
    assert items["call_400_digits"]["arguments"]["amount"] == HUGE
    assert items["call_5000_digits"]["arguments"]["amount"] == "-" + BEYOND_PYTHON
    assert items["call_beyond_double"]["arguments"]["amount"] == "1" + "0" * 400
    for name in ("nested_300", "nested_1100"):
        stand_in = items[f"call_{name}"]["arguments"]
        assert set(stand_in) == {"omitted", "digest"}
        assert stand_in["digest"].startswith("sha256:")

    export = await client.get("/audit/export", headers=admin(auth))
    assert export.status_code == 200
    exported = [json.loads(line) for line in export.text.splitlines()]
    assert [e["hash"] for e in exported] == [i["hash"] for i in listing.json()["items"]]

    report = (await client.get("/audit/verify", headers=admin(auth))).json()
    assert (report["ok"], report["checked"], report["stalled"]) == (True, rows, 0)
    verified = await asyncio.to_thread(cli, "audit", "verify", TOOLGATE_DATABASE_URL=database_url)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"checked {rows} sealed rows" in verified.stdout
    assert "Traceback" not in verified.stderr


@pytest.mark.parametrize(
    ("name", "original", "edited"),
    [
        ("400_digits", HUGE, "5" * 400),
        ("5000_digits", BEYOND_PYTHON, "8" * 5000),
        ("beyond_double", "1" + "0" * 400, "2" + "0" * 400),
        ("nested_300", "[]", "[1]"),
        ("nested_1100", "[]", "[1]"),
    ],
)
async def test_an_edit_of_an_unusual_value_after_sealing_is_named_by_verify(
    client: httpx.AsyncClient,
    auth: Auth,
    db: asyncpg.Connection,
    name: str,
    original: str,
    edited: str,
) -> None:
    for call, arguments in UNUSUAL.items():
        await insert_unusual(db, f"call_{call}", arguments)
    await wait_until_sealed(db, len(UNUSUAL))
    seq = list(UNUSUAL).index(name) + 1
    async with db.transaction():
        await db.execute("SET LOCAL session_replication_role = replica")
        status = await db.execute(
            "UPDATE audit_events SET arguments = replace(arguments::text, $1, $2)::jsonb"
            " WHERE seq = $3 AND arguments::text LIKE '%' || $1 || '%'",
            original,
            edited,
            seq,
        )
    assert status == "UPDATE 1"
    report = (await client.get("/audit/verify", headers=admin(auth))).json()
    assert report["ok"] is False
    assert report["first_broken"]["seq"] == seq


async def test_a_call_with_a_huge_number_still_has_a_history(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO calls (id, tenant, actor, tool, arguments, decision, code, state,"
        " policy_version, proposed_by)"
        " VALUES ('call_huge', 'acme', 'alice', 'issue_refund', $1::text::jsonb, 'deny',"
        " 'invalid_arguments', 'denied', 'v1#abc123', 'model')",
        UNUSUAL["400_digits"],
    )
    await insert_unusual(db, "call_huge", UNUSUAL["400_digits"])
    history = await client.get("/calls/call_huge", headers=auth())
    assert history.status_code == 200, history.text
    assert history.json()["proposal"]["arguments"]["amount"] == HUGE
    assert [d["event"] for d in history.json()["decisions"]] == ["denied"]


@pytest.fixture
async def lone(lone_database: str) -> AsyncIterator[tuple[asyncpg.Connection, Database]]:
    """A database no app seals: rows stay unsealed until a test seals them."""
    conn = await asyncpg.connect(lone_database)
    facade = Database(lone_database)
    await facade.open(min_size=1, max_size=2)
    yield conn, facade
    await facade.close()
    await conn.close()


async def test_rows_left_unsealed_past_the_stall_limit_make_verify_fail(
    lone: tuple[asyncpg.Connection, Database],
) -> None:
    conn, database = lone
    await append_aged(conn, STALL_S + 5)
    report = await verify(database)
    assert (report.ok, report.first_broken, report.unsealed, report.stalled) == (
        False,
        None,
        1,
        1,
    )
    assert "STALLED" in report.summary()
    await sealer.seal_all(database)
    report = await verify(database)
    assert (report.ok, report.stalled, report.checked) == (True, 0, 1)


async def test_a_fresh_unsealed_row_is_not_a_stall(
    lone: tuple[asyncpg.Connection, Database],
) -> None:
    conn, database = lone
    await append_aged(conn, 1)
    report = await verify(database)
    assert (report.ok, report.unsealed, report.stalled) == (True, 1, 0)


async def append_aged(conn: asyncpg.Connection, age_s: float) -> None:
    row = event(1)
    await conn.execute(
        "INSERT INTO audit_events (event, tenant, actor, call_id, at)"
        " VALUES ($1, $2, $3, $4, clock_timestamp() - make_interval(secs => $5))",
        row.event,
        row.tenant,
        row.actor,
        row.call_id,
        age_s,
    )
