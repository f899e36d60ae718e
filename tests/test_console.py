"""The console over HTTP: its pages and their safety headers, sensitive values shown only to
an approver who may decide the call, and cross-origin access only for configured origins.
What a person sees and clicks is tested in a real browser (``test_console_browser.py``)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from app.settings import ConfigError, Settings
from tests.conftest import Providers, running_app
from tests.flows import BOB, Auth, Flow, refund_args

ERIN = {"sub": "erin", "roles": "auditor"}
CAROL_APPROVER = {"sub": "carol", "roles": "finance_approver", "tenant": "globex"}
NOTE = "customer says the card was stolen"
PAGES = ["/console", "/console/audit", "/console/calls/call_123"]


@pytest.fixture
def flow(client: httpx.AsyncClient, auth: Auth) -> Flow:
    return Flow(client, auth)


@pytest.mark.parametrize("path", PAGES)
async def test_every_console_page_is_the_one_page_with_strict_headers(
    client: httpx.AsyncClient, path: str
) -> None:
    response = await client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "script-src 'self';" in csp
    assert "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert "set-cookie" not in response.headers
    page = response.text
    assert '<script type="module" src="/console/static/console.js"></script>' in page
    assert page.count("<script") == 1, "no inline script"
    assert "//" not in page, "nothing from elsewhere"


async def test_the_console_assets_are_served_and_nothing_else_is(
    client: httpx.AsyncClient,
) -> None:
    script = await client.get("/console/static/console.js")
    assert script.status_code == 200
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert not re.search(r"\.(inner|outer)HTML\b|insertAdjacentHTML|document\.write", script.text)
    style = await client.get("/console/static/console.css")
    assert style.headers["content-type"] == "text/css; charset=utf-8"
    for name in ("index.html", "..%2Frouter.py", "router.py", "%2e%2e%2F__init__.py"):
        missing = await client.get(f"/console/static/{name}")
        assert missing.status_code == 404, name
        assert missing.json()["code"] == "not_found"


async def pending_refund(flow: Flow) -> str:
    proposal = await flow.propose("issue_refund", refund_args(150.0, note=NOTE))
    await flow.dry_run(proposal["call_id"])
    return str(proposal["call_id"])


async def test_an_approver_who_may_decide_sees_sensitive_values_beside_the_masked_ones(
    flow: Flow, client: httpx.AsyncClient, auth: Auth
) -> None:
    call_id = await pending_refund(flow)
    inbox = (await client.get("/approvals", headers=auth(**BOB))).json()["items"]
    assert [i["call_id"] for i in inbox] == [call_id]
    assert inbox[0]["arguments"]["note"] == "[redacted]"
    assert inbox[0]["sensitive_arguments"] == {"note": NOTE}
    history = (await client.get(f"/calls/{call_id}", headers=auth(**BOB))).json()
    assert history["proposal"]["arguments"]["note"] == "[redacted]"
    assert history["proposal"]["sensitive_arguments"] == {"note": NOTE}
    assert history["may_decide"] is True


async def test_sensitive_values_stay_masked_for_auditors_the_audit_trail_and_decided_calls(
    flow: Flow, client: httpx.AsyncClient, auth: Auth
) -> None:
    call_id = await pending_refund(flow)
    audited = (await client.get(f"/calls/{call_id}", headers=auth(**ERIN))).json()
    assert audited["proposal"]["arguments"]["note"] == "[redacted]"
    assert "sensitive_arguments" not in audited["proposal"]
    assert audited["may_decide"] is False
    preview = audited["dry_runs"][-1]["snapshot_hash"]
    assert (await flow.approve(call_id, preview)).status_code == 200

    decided = (await client.get(f"/calls/{call_id}", headers=auth(**BOB))).json()
    assert "sensitive_arguments" not in decided["proposal"], "nothing left to decide"
    assert decided["may_decide"] is False
    approved = await client.get("/approvals?status=approved", headers=auth(**BOB))
    assert [i["call_id"] for i in approved.json()["items"]] == [call_id]
    assert "sensitive_arguments" not in approved.json()["items"][0]
    export = await client.get(f"/audit/export?call_id={call_id}", headers=auth(**ERIN))
    assert export.status_code == 200
    rows = [json.loads(line) for line in export.text.splitlines()]
    assert {r["event"] for r in rows} >= {"proposed", "dry_run", "approved"}
    assert NOTE not in export.text
    assert all(r["arguments"]["note"] == "[redacted]" for r in rows)


async def test_an_approver_who_may_not_decide_never_sees_sensitive_values(
    flow: Flow, client: httpx.AsyncClient, auth: Auth
) -> None:
    call_id = await pending_refund(flow)
    low = await flow.propose("issue_refund", refund_args(20.0, note=NOTE))
    assert low["impact"] == "low"
    for who, call in ((CAROL_APPROVER, call_id), (BOB, low["call_id"])):
        answer = await client.get(f"/calls/{call}", headers=auth(**who))
        if answer.status_code == 200:
            assert "sensitive_arguments" not in answer.json()["proposal"]
            assert NOTE not in answer.text
        else:
            assert answer.json()["code"] == "not_found"
    other_tenant = await client.get("/approvals", headers=auth(**CAROL_APPROVER))
    assert other_tenant.json()["items"] == []


def test_cors_origins_must_be_exact_origins() -> None:
    origins = "https://console.example.com, http://127.0.0.1:8081/"
    settings = Settings.from_env({"TOOLGATE_CORS_ORIGINS": origins})
    assert settings.cors_origins == ("https://console.example.com", "http://127.0.0.1:8081")
    assert Settings.from_env({}).cors_origins == ()
    for refused in ("*", "https://*.example.com", "https://example.com/console", "example.com"):
        with pytest.raises(ConfigError, match="TOOLGATE_CORS_ORIGINS"):
            Settings.from_env({"TOOLGATE_CORS_ORIGINS": refused})


def test_the_public_url_is_an_http_url_the_console_links_extend() -> None:
    public = Settings.from_env({"TOOLGATE_PUBLIC_URL": "https://gate.example.com/tg/"})
    assert public.public_url == "https://gate.example.com/tg"
    assert Settings.from_env({}).public_url is None
    for refused in (
        "gate.example.com",
        "ftp://gate.example.com",
        "https://gate.example.com/?a=1",
        "https://gate.example.com/#x",
        "https://user@gate.example.com",
        "https:///nohost",
    ):
        with pytest.raises(ConfigError, match="TOOLGATE_PUBLIC_URL"):
            Settings.from_env({"TOOLGATE_PUBLIC_URL": refused})


def preflight(origin: str) -> dict[str, str]:
    return {
        "origin": origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type",
    }


async def test_a_preflight_to_approve_is_answered_only_for_a_configured_origin(
    env: dict[str, str], clean: None
) -> None:
    allowed = "https://console.example.com"
    async with running_app({**env, "TOOLGATE_CORS_ORIGINS": allowed}) as c:
        answer = await c.options("/approve", headers=preflight(allowed))
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == allowed
        assert "POST" in answer.headers["access-control-allow-methods"]
        assert "authorization" in answer.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in answer.headers

        refused = await c.options("/approve", headers=preflight("https://evil.example"))
        assert refused.status_code == 400
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["code"] == "invalid_request"
        assert not any(h.startswith("access-control-") for h in refused.headers)

        read = await c.get("/healthz", headers={"origin": allowed})
        assert read.headers["access-control-allow-origin"] == allowed
        foreign = await c.get("/healthz", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in foreign.headers


async def test_without_cors_origins_no_origin_is_allowed(client: httpx.AsyncClient) -> None:
    answer = await client.options("/approve", headers=preflight("https://console.example.com"))
    assert answer.status_code == 405
    assert not any(h.startswith("access-control-") for h in answer.headers)


async def test_a_cross_origin_approve_answer_carries_the_allowed_origin(
    env: dict[str, str], clean: None, auth: Auth, providers: Providers
) -> None:
    allowed = "https://console.example.com"
    async with running_app({**env, "TOOLGATE_CORS_ORIGINS": allowed}) as c:
        flow = Flow(c, auth)
        proposal = await flow.propose("issue_refund", refund_args())
        preview = await flow.dry_run(proposal["call_id"])
        body = {
            "call_id": proposal["call_id"],
            "snapshot_hash": preview["snapshot_hash"],
            "decision": "approve",
        }
        answer = await c.post("/approve", json=body, headers={**auth(**BOB), "origin": allowed})
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == allowed
        denied = await c.post(
            "/propose",
            json={"tool": "get_order", "arguments": {"order_id": "ord_9"}},
            headers={**auth(), "origin": allowed},
        )
        assert denied.status_code == 403
        assert denied.headers["access-control-allow-origin"] == allowed
