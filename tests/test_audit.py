"""GET /audit, /audit/export and who may read them, through the ASGI app on real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from app.audit import service
from app.audit.store import AuditEvent, append
from tests.test_audit_chain import unsealed as unsealed_rows

Auth = Callable[..., dict[str, str]]
Row = tuple[str, str, str, str, str, str | None]
"""(tenant, actor, tool, event, call_id, run_id)"""
ITEM_FIELDS = {
    "seq",
    "time",
    "event",
    "call_id",
    "run_id",
    "tenant",
    "actor",
    "tool",
    "target",
    "fingerprint",
    "arguments",
    "decision",
    "code",
    "reason",
    "policy_version",
    "approval_id",
    "proposed_by",
    "authorized_by",
    "outcome",
    "timings",
    "hash",
    "prev_hash",
}
# Inserted in this order: seq 1..8.
EARLY: list[Row] = [
    ("acme", "alice", "get_order", "proposed", "call_1", "run_1"),
    ("acme", "alice", "get_order", "executed", "call_1", "run_1"),
    ("acme", "bob", "issue_refund", "denied", "call_2", None),
    ("globex", "gina", "get_order", "proposed", "call_3", "run_2"),
]
LATE: list[Row] = [
    ("acme", "alice", "issue_refund", "proposed", "call_4", "run_1"),
    ("acme", "bob", "issue_refund", "approved", "call_4", "run_1"),
    ("globex", "gina", "issue_refund", "denied", "call_5", None),
    ("acme", "alice", "issue_refund", "executed", "call_4", "run_1"),
]


def admin(auth: Auth) -> dict[str, str]:
    return auth("root", "ops", "admin")


def auditor(auth: Auth, tenant: str = "acme") -> dict[str, str]:
    return auth("audrey", tenant, "auditor")


async def insert(db: asyncpg.Connection, rows: list[Row]) -> None:
    for tenant, actor, tool, event, call_id, run_id in rows:
        await append(
            db,
            AuditEvent(
                event=event,
                tenant=tenant,
                actor=actor,
                tool=tool,
                call_id=call_id,
                run_id=run_id,
                target={"type": "order", "id": "ord_1"},
                arguments={"order_id": "ord_1", "amount": 12.5, "note": "[redacted]"},
                decision="deny" if event == "denied" else "allow",
                policy_version="v1#abc123",
                proposed_by="model",
                total_ms=1.25,
            ),
        )


@pytest.fixture
async def trail(db: asyncpg.Connection) -> datetime:
    """EARLY (seq 1-4), then the returned instant, then LATE (seq 5-8)."""
    await insert(db, EARLY)
    await asyncio.sleep(0.01)
    middle: datetime = await db.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(0.01)
    await insert(db, LATE)
    return middle


async def seqs(client: httpx.AsyncClient, headers: dict[str, str], **params: Any) -> list[int]:
    response = await client.get("/audit", params=params, headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["next_cursor"] is None
    return [item["seq"] for item in body["items"]]


async def test_a_time_window_holds_rows_whose_time_runs_a_little_behind_their_seq(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    """Seqs and times are stamped together, so a later seq may carry a slightly earlier time
    (up to the store's slack); a window is exact by time all the same."""
    start = datetime(2026, 11, 1, tzinfo=UTC)
    offsets_s = [0, 3, 1, 2, 30, 29]  # seqs 1..6
    for offset in offsets_s:
        await db.execute(
            "INSERT INTO audit_events (at, event, tenant, actor) VALUES ($1, 'proposed', 'acme',"
            " 'alice')",
            start + timedelta(seconds=offset),
        )

    def at(seconds: float) -> str:
        return (start + timedelta(seconds=seconds)).isoformat()

    assert await seqs(client, admin(auth), since=at(1.5), until=at(29.5)) == [2, 4, 6]
    assert await seqs(client, admin(auth), since=at(2.5)) == [2, 5, 6]
    assert await seqs(client, admin(auth), until=at(2.5)) == [1, 3, 4]
    assert await seqs(client, auditor(auth), since=at(29), until=at(31)) == [5, 6]
    assert await seqs(client, admin(auth), since=at(31)) == []
    assert await seqs(client, admin(auth), until=at(0)) == []


@pytest.mark.usefixtures("trail")
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, [1, 2, 3, 4, 5, 6, 7, 8]),
        ({"tenant": "globex"}, [4, 7]),
        ({"actor": "bob"}, [3, 6]),
        ({"tool": "get_order"}, [1, 2, 4]),
        ({"call_id": "call_4"}, [5, 6, 8]),
        ({"run_id": "run_1"}, [1, 2, 5, 6, 8]),
        ({"event": "denied"}, [3, 7]),
        ({"tenant": "acme", "actor": "alice", "event": "executed"}, [2, 8]),
    ],
)
async def test_each_filter_narrows_the_trail(
    client: httpx.AsyncClient, auth: Auth, params: dict[str, str], expected: list[int]
) -> None:
    assert await seqs(client, admin(auth), **params) == expected


async def test_since_is_inclusive_and_until_exclusive_in_rfc3339(
    client: httpx.AsyncClient, auth: Auth, trail: datetime
) -> None:
    middle = trail.isoformat()
    assert await seqs(client, admin(auth), since=middle) == [5, 6, 7, 8]
    assert await seqs(client, admin(auth), until=middle) == [1, 2, 3, 4]
    zulu = trail.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert await seqs(client, admin(auth), since=zulu, tenant="globex") == [7]
    first = (await client.get("/audit", headers=admin(auth))).json()["items"][0]
    assert await seqs(client, admin(auth), since=first["time"], until=middle) == [1, 2, 3, 4]


@pytest.mark.usefixtures("trail")
@pytest.mark.parametrize(
    "params",
    [
        {"since": "2026-01-01T00:00:00"},
        {"since": "yesterday"},
        {"until": "2026-02-30T00:00:00Z"},
        {"event": "deleted"},
        {"limit": "0"},
        {"limit": "1001"},
        {"cursor": "not-a-cursor"},
        {"cursor": "WyJ4Il0"},
    ],
)
async def test_malformed_queries_are_invalid_requests(
    client: httpx.AsyncClient, auth: Auth, params: dict[str, str]
) -> None:
    response = await client.get("/audit", params=params, headers=admin(auth))
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "invalid_request"


@pytest.mark.usefixtures("trail")
@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/audit", "tenat=acme"),
        ("/audit", "tenant=acme&tenant=globex"),
        ("/audit/export", "tenat=acme"),
        ("/audit/export", "limit=10"),
        ("/audit/export", "actor=alice&actor=bob"),
    ],
)
async def test_an_unknown_or_repeated_query_parameter_is_refused_not_ignored(
    client: httpx.AsyncClient, auth: Auth, path: str, query: str
) -> None:
    """A misspelt filter ignored would hand an admin every tenant's rows for the export they
    meant to be acme's; ``limit`` on the export would return every row, not ten."""
    response = await client.get(f"{path}?{query}", headers=admin(auth))
    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")


@pytest.mark.usefixtures("trail")
@pytest.mark.parametrize("path", ["/audit", "/audit/export"])
@pytest.mark.parametrize(
    "params",
    [
        {"since": "0001-01-01T00:00:00+00:01"},
        {"since": "0001-01-01T00:00:00+23:59"},
        {"until": "9999-12-31T23:59:59-00:01"},
        {"until": "9999-12-31T23:59:59.999999-23:59"},
    ],
)
async def test_a_time_whose_offset_leaves_the_years_1_to_9999_is_an_invalid_request(
    client: httpx.AsyncClient, auth: Auth, path: str, params: dict[str, str]
) -> None:
    """Well formed, but its UTC instant is before year 1 or after 9999: nothing can hold it."""
    response = await client.get(path, params=params, headers=admin(auth))
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "invalid_request"
    assert response.json()["detail"] == f"{next(iter(params))} is not a valid date-time"


@pytest.mark.usefixtures("trail")
async def test_the_first_and_last_instants_a_date_time_can_hold_are_valid_bounds(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    everything = [1, 2, 3, 4, 5, 6, 7, 8]
    assert await seqs(client, admin(auth), since="0001-01-01T00:00:00-00:01") == everything
    assert await seqs(client, admin(auth), since="0001-01-01T00:00:00Z") == everything
    assert await seqs(client, admin(auth), until="9999-12-31T23:59:59.999999Z") == everything
    assert await seqs(client, admin(auth), until="9999-12-31T23:59:59+23:59") == everything
    assert await seqs(client, admin(auth), until="0001-01-01T00:00:00+00:00") == []


async def test_items_carry_every_audit_field(
    client: httpx.AsyncClient, auth: Auth, trail: datetime
) -> None:
    response = await client.get("/audit", params={"limit": 1}, headers=admin(auth))
    [item] = response.json()["items"]
    assert set(item) == ITEM_FIELDS
    assert item["timings"] == {"total_ms": 1.25, "provider_ms": None}
    assert item["target"] == {"type": "order", "id": "ord_1"}
    assert item["arguments"]["note"] == "[redacted]"
    assert item["time"].endswith("Z")
    assert datetime.fromisoformat(item["time"]) < trail


async def test_cursor_pagination_walks_every_row_once(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    await insert(db, [("acme", "alice", "get_order", "proposed", f"c{i}", None) for i in range(23)])
    await insert(db, [("globex", "gina", "get_order", "proposed", "g", None)] * 2)
    cases: list[tuple[dict[str, str], int]] = [({}, 25), ({"tenant": "acme"}, 23)]
    for params, total in cases:
        seen: list[int] = []
        cursor = None
        pages = 0
        while True:
            query: dict[str, str | int] = {**params, "limit": 10}
            if cursor:
                query["cursor"] = cursor
            body = (await client.get("/audit", params=query, headers=admin(auth))).json()
            seen += [item["seq"] for item in body["items"]]
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == sorted(set(seen))
        assert (len(seen), pages) == (total, 3)


@pytest.mark.usefixtures("trail")
async def test_an_auditor_sees_only_their_own_tenant(client: httpx.AsyncClient, auth: Auth) -> None:
    assert await seqs(client, auditor(auth)) == [1, 2, 3, 5, 6, 8]
    assert await seqs(client, auditor(auth), tenant="acme", actor="bob") == [3, 6]
    assert await seqs(client, auditor(auth, "globex")) == [4, 7]
    for path in ("/audit", "/audit/export"):
        response = await client.get(path, params={"tenant": "globex"}, headers=auditor(auth))
        assert response.status_code == 403
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "forbidden"
        assert "gina" not in response.text


@pytest.mark.usefixtures("trail")
async def test_an_admin_sees_every_tenant(client: httpx.AsyncClient, auth: Auth) -> None:
    assert await seqs(client, admin(auth)) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert await seqs(client, admin(auth), tenant="globex") == [4, 7]


@pytest.mark.usefixtures("trail")
@pytest.mark.parametrize("path", ["/audit", "/audit/export", "/audit/verify"])
async def test_other_roles_are_refused_and_anonymous_callers_unauthenticated(
    client: httpx.AsyncClient, auth: Auth, path: str
) -> None:
    for roles in ("support", "finance_approver,customer", ""):
        response = await client.get(path, headers=auth("alice", "acme", roles))
        assert (response.status_code, response.json()["code"]) == (403, "forbidden")
    response = await client.get(path)
    assert (response.status_code, response.json()["code"]) == (401, "unauthenticated")
    response = await client.get(path, headers=auditor(auth))
    assert response.status_code == 200


def unsealed(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("hash", "prev_hash")}


async def test_export_streams_the_same_items_as_ndjson_across_pages(
    client: httpx.AsyncClient,
    auth: Auth,
    trail: datetime,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "EXPORT_PAGE", 3)
    await insert(db, [("acme", "alice", "get_order", "failed", f"c{i}", None) for i in range(7)])
    # Listing and export must see the same rows sealed: wait for the sealer to finish first.
    for _ in range(100):
        if not await unsealed_rows(db):
            break
        await asyncio.sleep(0.05)
    for headers, params in (
        (admin(auth), {}),
        (auditor(auth), {}),
        (admin(auth), {"tenant": "acme", "since": trail.isoformat()}),
        (auditor(auth), {"event": "failed"}),
    ):
        listed = (
            await client.get("/audit", params={**params, "limit": 1000}, headers=headers)
        ).json()["items"]
        async with client.stream("GET", "/audit/export", params=params, headers=headers) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/x-ndjson"
            lines = [line async for line in r.aiter_lines() if line]
        assert [orjson.loads(line) for line in lines] == listed
        assert len(listed) > 3


async def test_export_starts_after_a_cursor(
    client: httpx.AsyncClient, auth: Auth, trail: datetime
) -> None:
    first = (await client.get("/audit", params={"limit": 3}, headers=admin(auth))).json()
    response = await client.get(
        "/audit/export", params={"cursor": first["next_cursor"]}, headers=admin(auth)
    )
    assert [orjson.loads(line)["seq"] for line in response.text.splitlines()] == [4, 5, 6, 7, 8]


async def test_pages_of_large_rows_stop_at_a_byte_budget_and_lose_none(
    client: httpx.AsyncClient, auth: Auth, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A denied call's raw arguments are stored as sent, up to the body limit: a page of a
    hundred such rows (a thousand with ``limit``) was read into one answer, whatever its size,
    by any user able to make calls and an auditor listing them."""
    monkeypatch.setattr(service, "EXPORT_PAGE", 1000)
    large = {"order_id": "ord_1", "note": "x" * 700_000}
    for _ in range(8):
        denied = await client.post(
            "/propose", json={"tool": "get_order", "arguments": large}, headers=auth("mallory")
        )
        assert denied.status_code == 422, denied.text
    pages, cursor = [], None
    while True:
        params: dict[str, str | int] = {"actor": "mallory", "limit": 1000}
        if cursor:
            params["cursor"] = cursor
        answer = await client.get("/audit", params=params, headers=auditor(auth))
        assert answer.status_code == 200
        assert len(answer.content) < 5 << 20
        pages.append(answer.json()["items"])
        cursor = answer.json()["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [6, 2]
    seqs = [item["seq"] for page in pages for item in page]
    assert len(set(seqs)) == 8
    assert seqs == sorted(seqs)
    async with client.stream(
        "GET", "/audit/export", params={"actor": "mallory"}, headers=auditor(auth)
    ) as streamed:
        chunks = [len(chunk) async for chunk in streamed.aiter_bytes() if chunk]
        assert streamed.status_code == 200
    assert sum(chunks) > 8 * 700_000
