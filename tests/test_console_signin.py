"""Approvers sign in to the console with OpenID Connect: a real provider process
(``tests.oidc_provider``: oidc-provider-mock, registered clients, nonce and PKCE enforced),
a real toolgate whose tokens come from it (its JWKS), and headless Chromium clicking through
the provider's own sign-in page. Also: a tampered ``state``, a token from another issuer,
a session that expires on the page, and signing out."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlencode, urlsplit

import asyncpg
import httpx
import pytest
from playwright.async_api import Page, Route, expect

from app.main import create_app
from app.settings import Settings
from tests.conftest import ROOT, Providers, free_port, served
from tests.flows import Flow, refund_args

CLAIMS = {
    "alice": {"tid": "acme", "roles": ["support"]},
    "bob": {"tid": "acme", "roles": ["finance_approver"]},
}


class Provider(NamedTuple):
    url: str
    client_id: str
    redirect_uri: str


@contextmanager
def provider_process(origin: str, token_max_age: float = 3600.0) -> Iterator[Provider]:
    """A provider on a free port whose one client is the console at ``origin``."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.oidc_provider",
            "--port",
            str(port),
            "--origin",
            origin,
            "--token-max-age",
            str(token_max_age),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready", "the OIDC provider did not start"
        url = f"http://127.0.0.1:{port}"
        redirect = f"{origin}/console/callback"
        client = httpx.post(
            f"{url}/oauth2/clients",
            json={"redirect_uris": [redirect], "token_endpoint_auth_method": "none"},
        )
        assert client.status_code == 201, client.text
        for sub, claims in CLAIMS.items():
            assert httpx.put(f"{url}/users/{sub}", json=claims).status_code == 204
        yield Provider(url, client.json()["client_id"], redirect)
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def id_token(provider: Provider, sub: str) -> str:
    """An ID token for ``sub``, by the authorization-code flow with PKCE, as a script would
    get one (no browser)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    query = urlencode(
        {
            "response_type": "code",
            "client_id": provider.client_id,
            "redirect_uri": provider.redirect_uri,
            "scope": "openid",
            "state": "s",
            "nonce": secrets.token_urlsafe(16),
            "code_challenge": challenge.rstrip(b"=").decode(),
            "code_challenge_method": "S256",
        }
    )
    authorized = httpx.post(f"{provider.url}/oauth2/authorize?{query}", data={"sub": sub})
    assert authorized.status_code == 302, authorized.text
    code = parse_qs(urlsplit(authorized.headers["location"]).query)["code"][0]
    token = httpx.post(
        f"{provider.url}/oauth2/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": provider.redirect_uri,
            "client_id": provider.client_id,
            "code_verifier": verifier,
        },
    )
    assert token.status_code == 200, token.text
    return str(token.json()["id_token"])


class Console(NamedTuple):
    url: str
    provider: Provider
    client: httpx.AsyncClient


@asynccontextmanager
async def console_with_sign_in(
    env: dict[str, str], token_max_age: float = 3600.0
) -> AsyncIterator[Console]:
    """A toolgate served on a free port whose console signs in with its own provider."""
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    with provider_process(origin, token_max_age) as provider:
        settings = {k: v for k, v in env.items() if k != "TOOLGATE_JWT_SECRET"} | {
            "TOOLGATE_JWKS_URL": f"{provider.url}/jwks",
            "TOOLGATE_OIDC_ISSUER": provider.url,
            "TOOLGATE_OIDC_CLIENT_ID": provider.client_id,
        }
        application = create_app(Settings.from_env(settings))
        async with (
            application.router.lifespan_context(application),
            served(application, port=port) as url,
            httpx.AsyncClient(base_url=url) as client,
        ):
            yield Console(url, provider, client)


@pytest.fixture(scope="module")
async def console(env: dict[str, str]) -> AsyncIterator[Console]:
    async with console_with_sign_in(env) as started:
        yield started


def as_user(provider: Provider, sub: str) -> Any:
    token = id_token(provider, sub)
    return lambda **_: {"Authorization": f"Bearer {token}"}


async def pending_refund(console: Console) -> str:
    flow = Flow(console.client, as_user(console.provider, "alice"))
    proposal = await flow.propose("issue_refund", refund_args(150.0))
    await flow.dry_run(proposal["call_id"])
    return str(proposal["call_id"])


async def sign_in_at_provider(page: Page, sub: str) -> None:
    await page.locator("#sign-in-oidc").click()
    await page.locator('input[name="sub"]').fill(sub)
    await page.get_by_role("button", name="Authorize").click()


async def stored_token(page: Page) -> Any:
    return await page.evaluate("sessionStorage.getItem('toolgate.token')")


async def test_an_approver_signs_in_with_the_provider_and_approves_where_they_were(
    console: Console,
    page: Page,
    clean: None,
    providers: Providers,
    db: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    call_id = await pending_refund(console)
    await page.goto(f"{console.url}/console/calls/{call_id}")
    await expect(page.locator("#sign-in-oidc")).to_be_visible()
    keep = os.environ.get("TOOLGATE_SCREENSHOTS") == "1"
    shot = (ROOT / "docs" if keep else tmp_path) / "console-sign-in.png"
    await page.screenshot(path=str(shot), full_page=True)
    await sign_in_at_provider(page, "bob")
    await expect(page.locator("#state")).to_have_text("awaiting_approval", timeout=10_000)
    assert urlsplit(page.url).path == f"/console/calls/{call_id}"  # back where they were
    assert "code=" not in page.url
    assert "state=" not in page.url
    assert await page.context.cookies(console.url) == []  # the token is in no cookie
    assert "bob" in (await page.locator("#who").text_content() or "")
    await page.locator("#confirm").check()
    await page.locator("#approve").click()
    await expect(page.locator("#outcome")).to_contain_text("Approved")
    row = await db.fetchrow("SELECT approver, decision FROM approvals WHERE call_id = $1", call_id)
    assert row is not None
    assert (row["approver"], row["decision"]) == ("bob", "approve")

    await page.locator("#sign-out").click()
    await expect(page.locator("#sign-in-oidc")).to_be_visible()
    assert await stored_token(page) is None


async def test_an_answer_whose_state_was_tampered_with_signs_nobody_in(
    console: Console, page: Page, clean: None
) -> None:
    async def forge(route: Route) -> None:
        """The provider's answer, its redirect's ``state`` changed on the way back."""
        if route.request.method != "POST":
            await route.continue_()
            return
        answer = await route.fetch(max_redirects=0)
        location = urlsplit(answer.headers["location"])
        query = parse_qs(location.query)
        query["state"] = ["forged"]
        forged = location._replace(query=urlencode(query, doseq=True)).geturl()
        await route.fulfill(response=answer, headers={**answer.headers, "location": forged})

    await page.route(re.compile(r"/oauth2/authorize"), forge)
    await page.goto(f"{console.url}/console")
    await sign_in_at_provider(page, "bob")
    await expect(page.locator(".problem")).to_contain_text("its state differs", timeout=10_000)
    await expect(page.locator("#sign-in-oidc")).to_be_visible()
    assert await stored_token(page) is None
    assert "code=" not in page.url


async def test_a_token_from_another_issuer_is_refused(
    console: Console, env: dict[str, str]
) -> None:
    with provider_process(console.url) as other:
        foreign = id_token(other, "bob")
    ours = id_token(console.provider, "bob")
    for token, status in ((ours, 200), (foreign, 401)):
        answer = await console.client.get(
            "/approvals", headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == status, answer.text


async def test_a_session_that_expires_on_the_page_signs_in_again_and_comes_back(
    env: dict[str, str], page: Page, clean: None, providers: Providers
) -> None:
    async with console_with_sign_in(env, token_max_age=4) as short:
        call_id = await pending_refund(short)
        await page.goto(f"{short.url}/console/calls/{call_id}")
        await sign_in_at_provider(page, "bob")
        await expect(page.locator("#state")).to_have_text("awaiting_approval", timeout=10_000)
        await page.wait_for_timeout(5_000)  # the ID token has expired
        await page.reload()
        await expect(page.locator("#expired")).to_be_visible(timeout=10_000)
        await sign_in_at_provider(page, "bob")
        await expect(page.locator("#state")).to_have_text("awaiting_approval", timeout=10_000)
        assert urlsplit(page.url).path == f"/console/calls/{call_id}"


async def test_the_page_may_redeem_codes_only_at_the_discovered_token_endpoint(
    console: Console, env: dict[str, str]
) -> None:
    page = await console.client.get("/console/calls/call_1")
    policy = page.headers["content-security-policy"]
    assert f"connect-src 'self' {console.provider.url};" in policy
    assert "frame-ancestors 'none'" in policy
    config = (await console.client.get("/console/config")).json()["oidc"]
    assert config["token_endpoint"] == f"{console.provider.url}/oauth2/token"
    assert config["client_id"] == console.provider.client_id
    with provider_process("http://127.0.0.1:9") as other:
        # the provider names itself without the trailing slash configured: another issuer
        misnamed = {k: v for k, v in env.items() if k != "TOOLGATE_JWT_SECRET"} | {
            "TOOLGATE_JWKS_URL": f"{other.url}/jwks",
            "TOOLGATE_OIDC_ISSUER": other.url + "/",
            "TOOLGATE_OIDC_CLIENT_ID": other.client_id,
        }
        application = create_app(Settings.from_env(misnamed))
        async with (
            application.router.lifespan_context(application),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=application), base_url="http://toolgate"
            ) as client,
        ):
            refused = await client.get("/console/config")
            assert (refused.status_code, refused.json()["code"]) == (503, "unavailable")
            plain = await client.get("/console")
            assert "connect-src 'self';" in plain.headers["content-security-policy"]
