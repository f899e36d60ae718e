"""An identifier that is present is used: malformed (empty, blank, a space, a control
character) it is ``400 invalid_request``, well-formed but naming nothing the caller may see
it is ``404 not_found``; it is never read as absent. Left out, a ``run_id`` would take a call
out of its run's budget and provenance, so "present but empty" must not mean "none".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import Providers
from tests.flows import Flow, new_key, refund_args

Auth = Callable[..., dict[str, str]]
READ = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
TICKET = {"tool": "create_ticket", "arguments": {"subject": "s", "body": "b"}}
MALFORMED = ["", " ", "call x", "run\t1", "é", "x" * 201, "a/b", "%00"]


def assert_problem(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code


async def refusals(client: httpx.AsyncClient, route: str) -> float:
    """``toolgate_refusals_total`` for ``route`` and ``invalid_request``, from /metrics."""
    text = (await client.get("/metrics")).text
    line = f'toolgate_refusals_total{{code="invalid_request",route="{route}"}} '
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


@pytest.mark.parametrize("malformed", MALFORMED)
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/propose", READ, "run_id"),
        ("/propose", READ, "tool_call_id"),
        ("/execute", READ, "run_id"),
        ("/execute", READ, "call_id"),
        ("/execute", READ, "approval_id"),
        ("/execute", READ, "dry_run_id"),
        ("/execute", TICKET, "run_id"),
        ("/execute", {}, "call_id"),
        ("/dry-run", {}, "call_id"),
        ("/approve", {"snapshot_hash": None, "decision": "approve"}, "call_id"),
    ],
)
async def test_a_malformed_id_in_a_body_is_an_invalid_request_that_runs_nothing(
    client: httpx.AsyncClient,
    auth: Auth,
    providers: Providers,
    db: asyncpg.Connection,
    path: str,
    body: dict[str, Any],
    field: str,
    malformed: str,
) -> None:
    before = await refusals(client, path)
    headers = {**auth(), "Idempotency-Key": new_key()}
    response = await client.post(path, json={**body, field: malformed}, headers=headers)
    assert_problem(response, 400, "invalid_request")
    assert response.json()["errors"][0]["path"] == f"/{field}"
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert (await providers.stats())["requests"] == []
    assert await refusals(client, path) == before + 1  # recorded as a refusal


async def test_an_empty_call_id_alone_is_a_clean_invalid_request(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    """Taken as "no call id", the body had no arguments to run: a 500 once."""
    response = await client.post("/execute", json={"call_id": ""}, headers=auth())
    assert_problem(response, 400, "invalid_request")


async def test_a_well_formed_run_id_that_names_no_run_of_the_caller_is_not_found(
    flow: Flow, providers: Providers, db: asyncpg.Connection, auth: Auth
) -> None:
    carols = await flow.post("/runs", {}, who={"sub": "carol", "tenant": "globex"})
    for run_id in ("run_000000000000nothing", carols.json()["run_id"]):
        response = await flow.post("/execute", {**READ, "run_id": run_id})
        assert_problem(response, 404, "not_found")
    assert await db.fetchval("SELECT count(*) FROM calls") == 0
    assert (await providers.stats())["requests"] == []


async def test_an_unknown_approval_or_dry_run_id_is_not_found_not_ignored(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """For a read or a low-impact mutation no gate consults them; named, they must still
    name something of the caller's."""
    for body in (READ, TICKET):
        for field, value in (("approval_id", "apr_unknown"), ("dry_run_id", "dry_unknown")):
            response = await flow.post(
                "/execute", {**body, field: value}, headers={"Idempotency-Key": new_key()}
            )
            assert_problem(response, 404, "not_found")
    assert (await providers.stats())["effects_by_path"] == {}
    assert await db.fetchval("SELECT count(*) FROM executions") == 0


async def test_a_high_impact_call_with_an_unknown_approval_keeps_its_own_refusal(
    flow: Flow, providers: Providers
) -> None:
    response = await flow.execute("issue_refund", refund_args(), new_key(), approval_id="apr_x")
    assert_problem(response, 403, "approval_required")
    assert (await providers.stats())["effects_by_path"] == {}


@pytest.mark.parametrize("path", ["/calls/%20", "/calls/a%09b", "/runs/run%20x", "/runs/%C3%A9"])
async def test_a_malformed_path_id_is_an_invalid_request(
    client: httpx.AsyncClient, auth: Auth, path: str
) -> None:
    assert_problem(await client.get(path, headers=auth()), 400, "invalid_request")


async def test_a_malformed_run_id_cannot_be_finished(client: httpx.AsyncClient, auth: Auth) -> None:
    response = await client.post(
        "/runs/run%20x/finish", json={"status": "completed"}, headers=auth()
    )
    assert_problem(response, 400, "invalid_request")


@pytest.mark.parametrize("path", ["/calls/call_unknown", "/runs/run_unknown"])
async def test_a_well_formed_unknown_path_id_is_not_found(
    client: httpx.AsyncClient, auth: Auth, path: str
) -> None:
    assert_problem(await client.get(path, headers=auth()), 404, "not_found")


@pytest.mark.parametrize("query", ["call_id=", "run_id=", "call_id=%20", "run_id=a%20b", "cursor="])
async def test_an_empty_audit_filter_or_cursor_is_malformed_not_every_row(
    client: httpx.AsyncClient, auth: Auth, query: str
) -> None:
    erin = auth(sub="erin", roles="auditor")
    for path in ("/audit", "/audit/export"):
        assert_problem(await client.get(f"{path}?{query}", headers=erin), 400, "invalid_request")


async def test_an_empty_inbox_cursor_is_malformed_not_the_first_page(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    bob = auth(sub="bob", roles="finance_approver")
    assert_problem(await client.get("/approvals?cursor=", headers=bob), 400, "invalid_request")


async def test_another_tenants_call_cannot_be_approved_and_looks_missing(
    flow: Flow, auth: Auth, db: asyncpg.Connection
) -> None:
    """As on every other endpoint, another tenant's call and a missing one answer alike."""
    proposal = await flow.propose("issue_refund", refund_args())
    await flow.dry_run(proposal["call_id"])
    snapshot = await db.fetchval("SELECT snapshot_hash FROM dry_runs")
    globex = {"sub": "gina", "tenant": "globex", "roles": "finance_approver"}
    other = await flow.approve(proposal["call_id"], snapshot, who=globex)
    missing = await flow.approve("call_000000000000missing", snapshot, who=globex)
    assert_problem(other, 404, "not_found")
    assert_problem(missing, 404, "not_found")
    assert other.json()["detail"] == missing.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM approvals") == 0
