"""Input that PostgreSQL, asyncpg's jsonb codec or RFC 8785 cannot take: refused as a problem
and, where there is a call to record it under, recorded in a form that can be read back.

NUL and lone surrogates in texts, integers beyond ±(2**53-1), JSON's non-finite number tokens,
in every place a request can carry them: arguments, tool names, body fields, path ids, query
parameters and pagination cursors. (Token claims: ``test_auth``.)
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest

from tests.flows import Flow, refund_args
from tests.test_audit_chain import unsealed

Auth = Callable[..., dict[str, str]]
JSON = {"content-type": "application/json"}
HUGE = "9" * 400


def admin(auth: Auth) -> dict[str, str]:
    return auth(sub="root", roles="admin")


async def post(client: httpx.AsyncClient, path: str, text: str, headers: dict[str, str]) -> Any:
    """A body sent as this exact JSON text (tokens such as ``NaN`` included)."""
    return await client.post(path, content=text.encode(), headers={**headers, **JSON})


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    return body


async def sealed(db: asyncpg.Connection) -> None:
    """Wait until the test app's audit sealer has chained every row."""
    deadline = time.monotonic() + 5
    while await unsealed(db):
        assert time.monotonic() < deadline, "the sealer did not seal the rows"
        await asyncio.sleep(0.05)


async def assert_readable(client: httpx.AsyncClient, auth: Auth, call_id: str) -> None:
    """The stored call reads back everywhere it is shown."""
    for path in (f"/calls/{call_id}", "/audit", "/audit/export"):
        response = await client.get(path, params={"call_id": call_id}, headers=admin(auth))
        assert response.status_code == 200, (path, response.text)
        assert call_id in response.text


# --- arguments: refused as invalid_arguments, recorded --------------------------------------


@pytest.mark.parametrize(
    ("argument", "recorded"),
    [
        (HUGE, HUGE),
        ("-" + HUGE, "-" + HUGE),
        (str(2**53), str(2**53)),
        (str(-(2**64)), str(-(2**64))),
        ('"a\\u0000b"', "a\\u0000b"),
        ('["x", {"k": "\\u0000"}]', ["x", {"k": "\\u0000"}]),
    ],
)
async def test_an_argument_that_cannot_be_stored_is_refused_recorded_and_readable(
    client: httpx.AsyncClient,
    auth: Auth,
    db: asyncpg.Connection,
    argument: str,
    recorded: Any,
) -> None:
    """Even for a token without roles: the schema check, and so this one, comes first."""
    text = f'{{"tool":"get_order","arguments":{{"order_id":"ord_1","n":{argument}}}}}'
    response = await post(client, "/propose", text, auth(roles=""))
    body = assert_problem(response, 422, "invalid_arguments")
    assert body["errors"]
    assert all(error["path"].startswith("/n") for error in body["errors"])
    call = await db.fetchrow("SELECT * FROM calls WHERE id = $1", body["call_id"])
    assert call is not None
    assert (call["decision"], call["code"], call["arguments"]) == (
        "deny",
        "invalid_arguments",
        None,
    )
    event = await db.fetchrow("SELECT * FROM audit_events WHERE call_id = $1", body["call_id"])
    assert event is not None
    assert event["arguments"] == {"order_id": "ord_1", "n": recorded}
    await sealed(db)
    await assert_readable(client, auth, body["call_id"])
    verified = await client.get("/audit/verify", headers=admin(auth))
    assert verified.status_code == 200
    assert verified.json()["ok"] is True, verified.text


async def test_the_largest_safe_integers_are_not_refused_as_unrecordable(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    """±(2**53-1) fit: the refusal that follows is the schema's, as for any number here."""
    for number in (2**53 - 1, -(2**53 - 1)):
        text = f'{{"tool":"get_order","arguments":{{"order_id":"ord_1","n":{number}}}}}'
        body = assert_problem(
            await post(client, "/propose", text, auth()), 422, "invalid_arguments"
        )
        assert body["detail"] == "arguments do not match the tool's schema"


async def test_a_nul_in_an_argument_key_is_refused_and_recorded_escaped(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    text = '{"tool":"create_ticket","arguments":{"subject":"s","body":"b","a\\u0000b":1}}'
    body = assert_problem(await post(client, "/execute", text, auth()), 422, "invalid_arguments")
    assert body["errors"] == [
        {"path": "/a\\u0000b", "message": "a key with a NUL or a lone surrogate"}
    ]
    event = await db.fetchrow("SELECT * FROM audit_events WHERE call_id = $1", body["call_id"])
    assert event is not None
    assert event["arguments"] == {"subject": "s", "body": "b", "a\\u0000b": 1}
    await assert_readable(client, auth, body["call_id"])


async def test_a_valid_call_with_a_nul_in_a_free_text_argument_is_refused_before_the_provider(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection, providers: Any
) -> None:
    """The schema would accept it; it would reach the provider and then fail to be stored."""
    text = '{"tool":"create_ticket","arguments":{"subject":"s\\u0000","body":"b"}}'
    response = await client.post(
        "/execute",
        content=text.encode(),
        headers={**auth(), **JSON, "Idempotency-Key": "key-nul-in-subject-0001"},
    )
    body = assert_problem(response, 422, "invalid_arguments")
    assert await db.fetchval("SELECT count(*) FROM executions") == 0
    assert await providers.requests() == []
    await assert_readable(client, auth, body["call_id"])


# --- tool names: unknown_tool, recorded escaped ---------------------------------------------


async def test_a_nul_in_a_tool_name_is_an_unknown_tool_recorded_escaped(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection
) -> None:
    text = '{"tool":"get\\u0000order","arguments":{"order_id":"ord_1"},"tool_call_id":"tc_1"}'
    body = assert_problem(await post(client, "/propose", text, auth()), 404, "unknown_tool")
    call = await db.fetchrow("SELECT * FROM calls WHERE id = $1", body["call_id"])
    assert call is not None
    assert (call["tool"], call["tool_call_id"]) == ("get\\u0000order", "tc_1")
    event = await db.fetchrow("SELECT * FROM audit_events WHERE call_id = $1", body["call_id"])
    assert event is not None
    assert event["tool"] == "get\\u0000order"
    assert event["arguments"] == {"order_id": "ord_1"}
    await assert_readable(client, auth, body["call_id"])


# --- bodies: non-finite numbers and unstorable fields are malformed requests ----------------

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 400 + ".0"]


@pytest.mark.parametrize("number", NON_FINITE)
@pytest.mark.parametrize(
    ("path", "template"),
    [
        (
            "/propose",
            '{"tool":"issue_refund","arguments":'
            '{"order_id":"ord_1","amount":%s,"customer_id":"alice"}}',
        ),
        ("/execute", '{"tool":"get_order","arguments":{"order_id":"ord_1","x":[%s]}}'),
        ("/runs", '{"limits":{"max_cost":%s}}'),
        ("/approve", '{"call_id":"c","snapshot_hash":%s,"decision":"approve"}'),
    ],
)
async def test_a_non_finite_number_anywhere_in_a_body_is_a_malformed_request(
    client: httpx.AsyncClient,
    auth: Auth,
    db: asyncpg.Connection,
    number: str,
    path: str,
    template: str,
) -> None:
    text = template % number
    assert_problem(await post(client, path, text, auth()), 400, "invalid_request")
    for table in ("calls", "audit_events", "runs"):
        assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0


@pytest.fixture
async def run_id(client: httpx.AsyncClient, auth: Auth) -> str:
    response = await client.post("/runs", json={}, headers=auth())
    return str(response.json()["run_id"])


BODY_FIELDS = [
    ("/propose", {"tool": "get_order", "arguments": {}}, "run_id"),
    ("/propose", {"tool": "get_order", "arguments": {}}, "tool_call_id"),
    ("/execute", {"tool": "get_order", "arguments": {}}, "call_id"),
    ("/execute", {"tool": "get_order", "arguments": {}}, "approval_id"),
    ("/execute", {"tool": "get_order", "arguments": {}}, "dry_run_id"),
    ("/execute", {"tool": "get_order", "arguments": {}}, "run_id"),
    ("/dry-run", {}, "call_id"),
    ("/approve", {"call_id": "c", "snapshot_hash": None, "decision": "approve"}, "call_id"),
    ("/approve", {"call_id": "c", "snapshot_hash": None, "decision": "approve"}, "snapshot_hash"),
    ("/approve", {"call_id": "c", "snapshot_hash": None, "decision": "approve"}, "comment"),
    ("/runs", {}, "task"),
    ("/runs/{run}/finish", {"status": "completed"}, "reason"),
]


@pytest.mark.parametrize("text", ["a\x00b", "\ud800"])
@pytest.mark.parametrize(("path", "body", "field"), BODY_FIELDS)
async def test_an_id_or_text_field_that_cannot_be_stored_is_a_malformed_request(
    client: httpx.AsyncClient,
    auth: Auth,
    db: asyncpg.Connection,
    run_id: str,
    text: str,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    """Lone surrogates: the decision endpoints' parser refuses them as invalid JSON, the
    others' as text that cannot be stored; both are malformed requests."""
    document = json.dumps({**body, field: text})
    response = await post(client, path.replace("{run}", run_id), document, auth())
    problem = assert_problem(response, 400, "invalid_request")
    if text == "a\x00b":
        assert problem["errors"][0]["path"] == f"/{field}"
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert await db.fetchval("SELECT count(*) FROM runs") == 1
    assert await db.fetchval("SELECT count(*) FROM runs WHERE status = 'active'") == 1


# --- path ids, query parameters, cursors ----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/calls/call%00"),
        ("GET", "/runs/%00"),
        ("POST", "/runs/run_%00x/finish"),
    ],
)
async def test_a_nul_in_a_path_id_names_nothing(
    client: httpx.AsyncClient, auth: Auth, method: str, path: str
) -> None:
    response = await client.request(method, path, json={"status": "completed"}, headers=auth())
    assert_problem(response, 404, "not_found")


@pytest.mark.parametrize("path", ["/runs/{run}%2Ffinish", "/runs/{run}%2ffinish"])
async def test_an_encoded_slash_in_a_path_names_nothing(
    client: httpx.AsyncClient, auth: Auth, db: asyncpg.Connection, run_id: str, path: str
) -> None:
    """Routes match the decoded path: without the refusal this finished the run, while a
    proxy in front saw a single segment after ``/runs/``."""
    path = path.replace("{run}", run_id)
    response = await client.post(path, json={"status": "completed"}, headers=auth())
    assert_problem(response, 404, "not_found")
    assert await db.fetchval("SELECT status FROM runs WHERE id = $1", run_id) == "active"


@pytest.mark.parametrize(
    "path",
    [
        "/audit?actor=a%00",
        "/audit?call_id=%00",
        "/audit/export?tool=%00",
        "/approvals?cursor=%00",
        "/approvals?status=pending&x%00=1",
        "/catalog?format=%00",
    ],
)
async def test_a_nul_in_a_query_parameter_is_a_malformed_request(
    client: httpx.AsyncClient, auth: Auth, path: str
) -> None:
    assert_problem(await client.get(path, headers=admin(auth)), 400, "invalid_request")


def cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


MALFORMED_CURSORS = {
    "not_base64": "%%%",
    "not_json": cursor("not json"),
    "an_object": cursor('{"a": 1}'),
    "a_bare_string": cursor('"x"'),
    "too_few_values": cursor("[]"),
    "a_null": cursor("[null]"),
    "a_bool": cursor("[true]"),
    "a_float": cursor("[1.5]"),
    "a_negative_number": cursor("[-1]"),
    "beyond_64_bits": cursor(f"[{2**64}]"),
    "a_huge_number": cursor(f"[{HUGE}]"),
    "digits_as_text": cursor('["99999999999999999999999"]'),
    "non_ascii_digits": cursor('["\\u00b2"]'),
    "a_nul": cursor('["\\u0000"]'),
    "a_nested_list": cursor("[[1]]"),
}
MALFORMED_INBOX_CURSORS = {
    "not_a_timestamp": cursor('["not a time", "call_x"]'),
    "a_timestamp_without_offset": cursor('["2026-01-01T00:00:00", "call_x"]'),
    "an_id_that_is_a_number": cursor('["2026-01-01T00:00:00+00:00", 5.5]'),
    "a_nul_in_the_id": cursor('["2026-01-01T00:00:00+00:00", "a\\u0000"]'),
    "three_values": cursor('["2026-01-01T00:00:00+00:00", "call_x", "y"]'),
    "a_timestamp_before_year_1_in_utc": cursor('["0001-01-01T00:00:00+23:59", "c"]'),
    "a_timestamp_after_year_9999_in_utc": cursor('["9999-12-31T23:59:59-23:59", "c"]'),
    "a_minute_before_year_1_in_utc": cursor('["0001-01-01T00:00:00+00:01", "call_x"]'),
}


@pytest.mark.parametrize("kind", list(MALFORMED_CURSORS))
async def test_a_malformed_audit_cursor_is_a_malformed_request(
    client: httpx.AsyncClient, auth: Auth, kind: str
) -> None:
    for path in ("/audit", "/audit/export"):
        response = await client.get(
            path, params={"cursor": MALFORMED_CURSORS[kind]}, headers=admin(auth)
        )
        assert assert_problem(response, 400, "invalid_request")["detail"] == "malformed cursor"


@pytest.mark.parametrize("kind", list(MALFORMED_CURSORS) + list(MALFORMED_INBOX_CURSORS))
async def test_a_malformed_inbox_cursor_is_a_malformed_request(
    client: httpx.AsyncClient, auth: Auth, kind: str
) -> None:
    value = {**MALFORMED_CURSORS, **MALFORMED_INBOX_CURSORS}[kind]
    response = await client.get(
        "/approvals",
        params={"cursor": value},
        headers=auth(sub="bob", roles="finance_approver"),
    )
    assert assert_problem(response, 400, "invalid_request")["detail"] == "malformed cursor"


async def test_the_inbox_pages_on_with_the_cursor_it_gave(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    """The strict cursor still takes what the inbox writes (a page is 50 requests)."""
    flow = Flow(client, auth)
    for _ in range(51):
        proposal = await flow.propose("issue_refund", refund_args(150.0))
        await flow.dry_run(proposal["call_id"])
    bob = auth(sub="bob", roles="finance_approver")
    first = (await client.get("/approvals", headers=bob)).json()
    assert len(first["items"]) == 50
    response = await client.get("/approvals", params={"cursor": first["next_cursor"]}, headers=bob)
    assert response.status_code == 200, response.text
    assert len(response.json()["items"]) == 1
