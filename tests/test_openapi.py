"""The OpenAPI document: served, valid OpenAPI 3.1, the same as the committed copy, complete
(every endpoint, bodies, answers, problems with their codes, the bearer scheme), and true:
real answers of every endpoint, refusals included, match the schemas it gives them. The
reference page at /docs loads everything from toolgate itself."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate
from playwright.async_api import Browser

from app.main import create_app
from app.openapi import text
from app.settings import Settings
from tests.conftest import ROOT
from tests.flows import BOB, Auth, new_key, refund_args

COMMITTED = ROOT / "docs" / "openapi.json"
ENDPOINTS = {
    ("post", "/propose"),
    ("post", "/dry-run"),
    ("post", "/approve"),
    ("post", "/execute"),
    ("get", "/calls/{call_id}"),
    ("get", "/approvals"),
    ("get", "/catalog"),
    ("get", "/audit"),
    ("get", "/audit/export"),
    ("get", "/audit/verify"),
    ("post", "/runs"),
    ("get", "/runs/{run_id}"),
    ("post", "/runs/{run_id}/finish"),
    ("patch", "/runs/{run_id}"),
    ("put", "/known-values/{kind}/{value}"),
    ("delete", "/known-values/{kind}/{value}"),
    ("get", "/known-values/{kind}"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
}
OPEN = {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")}
"""The endpoints that need no token."""

Answer = tuple[str, str, httpx.Response]
"""(method, path template, response)."""


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(Settings.from_env({})).openapi()


def test_the_committed_document_is_the_one_the_code_makes(document: dict[str, Any]) -> None:
    """Regenerate it with ``python -m app.openapi > docs/openapi.json``."""
    assert COMMITTED.read_text() == text(document), "docs/openapi.json is stale"


async def test_the_served_document_is_valid_openapi_3_1(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    served = response.json()
    assert served["openapi"] == "3.1.0"
    validate(served)
    assert served == json.loads(COMMITTED.read_text())


def test_every_endpoint_is_described_with_its_bodies_answers_and_problems(
    document: dict[str, Any],
) -> None:
    operations = {(m, p): op for p, ops in document["paths"].items() for m, op in ops.items()}
    assert set(operations) == ENDPOINTS
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
    }
    for key, operation in operations.items():
        responses = operation["responses"]
        assert "200" in responses, key
        if key[0] == "post" and key[1] != "/runs":
            assert operation["requestBody"]["required"] is True, key
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                schema = response["content"]["application/problem+json"]["schema"]
                assert schema["allOf"][0] == {"$ref": "#/components/schemas/Problem"}, key
                assert schema["allOf"][1]["properties"]["code"]["enum"], key
        assert ("security" in operation) == (key not in OPEN), key
        if key not in OPEN:
            assert "401" in responses, key
    execute = operations[("post", "/execute")]
    assert {p["name"] for p in execute["parameters"]} == {"Idempotency-Key"}
    for (method, path), rows in error_tables().items():
        described = codes_by_status(operations[(method, path)])
        for statuses, codes in rows:
            for code in codes:
                assert any(code in described.get(s, ()) for s in statuses), (path, code)


def error_tables() -> dict[tuple[str, str], list[tuple[list[str], list[str]]]]:
    """The error tables of docs/api.md's endpoint sections: ``(statuses, codes)`` rows."""
    tables: dict[tuple[str, str], list[tuple[list[str], list[str]]]] = {}
    section: tuple[str, str] | None = None
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        heading = re.fullmatch(r"## (GET|POST) (/\S+)", line)
        if line.startswith("## "):
            section = (heading[1].lower(), heading[2]) if heading else None
        row = re.match(r"\| ([\d, ]+) \| ([`a-z_, ]+) \|", line)
        if section is not None and row is not None:
            statuses = [s.strip() for s in row[1].split(",")]
            tables.setdefault(section, []).append((statuses, re.findall(r"`([a-z_]+)`", row[2])))
    assert len(tables) >= 4, tables.keys()
    return tables


def codes_by_status(operation: dict[str, Any]) -> dict[str, list[str]]:
    return {
        status: response["content"]["application/problem+json"]["schema"]["allOf"][1]["properties"][
            "code"
        ]["enum"]
        for status, response in operation["responses"].items()
        if status[0] in "45"
    }


async def walk(client: httpx.AsyncClient, auth: Auth) -> list[Answer]:
    """A request to every endpoint, and a refusal of most kinds, as a client makes them."""
    answers: list[Answer] = []

    async def ask(method: str, template: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await client.request(method, path, **kwargs)
        answers.append((method.lower(), template, response))
        return response

    auditor = auth(roles="auditor")
    refund = {"tool": "issue_refund", "arguments": refund_args()}
    proposal = (await ask("POST", "/propose", "/propose", json=refund, headers=auth())).json()
    call_id = proposal["call_id"]
    preview = await ask("POST", "/dry-run", "/dry-run", json={"call_id": call_id}, headers=auth())
    approve = {"call_id": call_id, "snapshot_hash": preview.json()["snapshot_hash"]}
    await ask("GET", "/approvals", "/approvals", headers=auth(**BOB))
    approval = await ask(
        "POST", "/approve", "/approve", json={**approve, "decision": "approve"}, headers=auth(**BOB)
    )
    executed = {**refund, "approval_id": approval.json()["approval_id"]}
    key = {"Idempotency-Key": new_key()}
    await ask("POST", "/execute", "/execute", json=executed, headers={**auth(), **key})
    await ask("POST", "/execute", "/execute", json=executed, headers={**auth(), **key})
    read = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
    await ask("POST", "/execute", "/execute", json=read, headers=auth())
    await ask("GET", "/calls/{call_id}", f"/calls/{call_id}", headers=auth())
    for fmt in ("raw", "openai", "openai-responses", "anthropic", "mcp"):
        await ask("GET", "/catalog", f"/catalog?format={fmt}", headers=auth())
    await ask("GET", "/audit", "/audit?limit=3", headers=auditor)
    await ask("GET", "/audit/export", "/audit/export", headers=auditor)
    await ask("GET", "/audit/verify", "/audit/verify", headers=auditor)
    scoped = {"task": "refunds", "scope": {"tools": ["get_order", "issue_refund"]}}
    run = (await ask("POST", "/runs", "/runs", json=scoped, headers=auth())).json()
    in_run = {**read, "run_id": run["run_id"]}
    await ask("POST", "/propose", "/propose", json=in_run, headers=auth())
    await ask("GET", "/runs/{run_id}", f"/runs/{run['run_id']}", headers=auth())
    narrower = {"scope": {"tools": ["get_order"]}}
    await ask("PATCH", "/runs/{run_id}", f"/runs/{run['run_id']}", json=narrower, headers=auth())
    admin = auth(sub="root", roles="admin")
    known = "/known-values/payee/DE89 3704 0044 0532 0130 00"
    await ask("PUT", "/known-values/{kind}/{value}", known, headers=admin)
    await ask("GET", "/known-values/{kind}", "/known-values/payee", headers=admin)
    await ask("DELETE", "/known-values/{kind}/{value}", known, headers=admin)
    finish = {"status": "completed"}
    run_path = f"/runs/{run['run_id']}/finish"
    await ask("POST", "/runs/{run_id}/finish", run_path, json=finish, headers=auth())
    await ask("GET", "/healthz", "/healthz")
    await ask("GET", "/readyz", "/readyz")
    await ask("GET", "/metrics", "/metrics")
    # Refusals: each answered as a problem the document lists for its endpoint.
    await ask("POST", "/propose", "/propose", json=read)
    foreign = {"tool": "get_order", "arguments": {"order_id": "ord_9"}}
    await ask("POST", "/propose", "/propose", json=foreign, headers=auth())
    await ask(
        "POST", "/propose", "/propose", json={"tool": "nope", "arguments": {}}, headers=auth()
    )
    bad = {"tool": "get_order", "arguments": {"order_id": 7}}
    await ask("POST", "/propose", "/propose", json=bad, headers=auth())
    await ask("POST", "/propose", "/propose", json={"tool": "x"}, headers=auth())
    await ask("POST", "/execute", "/execute", json=refund, headers=auth())
    await ask("POST", "/execute", "/execute", json=refund, headers={**auth(), **key})
    again = {**approve, "decision": "approve"}  # the call has run: 409
    await ask("POST", "/approve", "/approve", json=again, headers=auth(**BOB))
    await ask("POST", "/approve", "/approve", json=again, headers=auth())  # its actor: 403
    await ask("GET", "/calls/{call_id}", "/calls/call_nope", headers=auth())
    await ask("GET", "/audit", "/audit", headers=auth())
    await ask("GET", "/runs/{run_id}", "/runs/run_nope", headers=auth())
    await ask("POST", "/runs/{run_id}/finish", run_path, json=finish, headers=auth())
    await ask("PATCH", "/runs/{run_id}", f"/runs/{run['run_id']}", json=scoped, headers=auth())
    await ask("PUT", "/known-values/{kind}/{value}", known, headers=auth())
    return answers


async def test_real_answers_match_the_schemas_the_document_gives_them(
    client: httpx.AsyncClient, auth: Auth, document: dict[str, Any]
) -> None:
    answers = await walk(client, auth)
    checked: set[tuple[str, str]] = set()
    statuses: set[int] = set()
    for method, template, response in answers:
        operation = document["paths"][template][method]
        described = operation["responses"].get(str(response.status_code))
        assert described is not None, (method, template, response.status_code, response.text)
        media_type = response.headers["content-type"].split(";")[0]
        schema = described["content"][media_type]["schema"]
        if media_type in ("application/json", "application/problem+json"):
            body = response.json()
        else:
            body = response.text
        jsonschema.validate(
            body,
            {"allOf": [schema], "components": document["components"]},
            cls=jsonschema.Draft202012Validator,
        )
        checked.add((method, template))
        statuses.add(response.status_code)
    assert checked == ENDPOINTS
    assert {(m, t) for m, t, r in answers if r.status_code == 200} == ENDPOINTS
    assert {400, 401, 403, 404, 409, 422} <= statuses


async def test_the_reference_page_loads_only_from_toolgate(browser: Browser, base_url: str) -> None:
    """Swagger UI renders the document, and the browser asks nothing of any other origin
    (the page's policy would refuse it, and that would show as a console error)."""
    async with httpx.AsyncClient(base_url=base_url) as plain:
        page_answer = await plain.get("/docs")
    policy = page_answer.headers["content-security-policy"]
    assert "script-src 'self';" in policy
    assert "connect-src 'self';" in policy
    assert "http" not in policy
    context = await browser.new_context()
    page = await context.new_page()
    requested: list[str] = []
    refused: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.on("console", lambda m: refused.append(m.text) if m.type == "error" else None)
    await page.goto(f"{base_url}/docs")
    await page.get_by_text("/propose").first.wait_for(timeout=15_000)
    await page.get_by_text("/audit/verify").first.wait_for()
    await context.close()
    origins = {f"{urlsplit(u).scheme}://{urlsplit(u).netloc}" for u in requested}
    assert origins == {base_url}, requested
    assert any(u.endswith("/docs/swagger-ui-bundle.js") for u in requested)
    assert any(u.endswith("/openapi.json") for u in requested)
    assert refused == []
