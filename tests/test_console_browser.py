"""The console in a real browser: headless Chromium (the system's ``chromium``, driven by
Playwright; nothing is downloaded) against a real toolgate on a loopback port, with the demo
providers counting their effects.

One server and one browser per module; each test gets a fresh browser context, so nothing
(the token in session storage included) carries from one test to the next. With
``TOOLGATE_SCREENSHOTS=1`` the tests refresh the screenshots under ``docs/``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import Page, expect

from app.main import create_app
from app.settings import Settings
from examples.demo_providers import ATTACKER_IBAN
from tests.conftest import ROOT, Providers, served
from tests.flows import ALICE, BOB, Auth, Flow, new_key, refund_args
from tests.test_endorsement import ENDORSED

Token = Callable[..., str]
REFUNDS = "/billing/refunds"
SCRIPT = '<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">'


@pytest.fixture
def flow(client: httpx.AsyncClient, auth: Auth) -> Flow:
    return Flow(client, auth)


@asynccontextmanager
async def serving(
    env: dict[str, str], directory: Path, files: dict[str, str]
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """Another toolgate, served, whose catalog is ``files`` (name → text) written into
    ``directory``; yields its base URL and a client of it."""
    for name, text in files.items():
        (directory / name).write_text(text)
    application = create_app(Settings.from_env({**env, "TOOLGATE_CATALOG": str(directory)}))
    async with (
        application.router.lifespan_context(application),
        served(application) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        yield url, client


@pytest.fixture
async def open_schema(env: dict[str, str], tmp_path: Path, clean: None) -> AsyncIterator[str]:
    """Its ``issue_refund`` takes arguments it does not declare (its schema without
    ``additionalProperties: false``); yields its base URL."""
    text = (ROOT / "catalog" / "demo.yaml").read_text()
    refund = text.index("  issue_refund:")
    opened = text[:refund] + text[refund:].replace("      additionalProperties: false\n", "", 1)
    async with serving(env, tmp_path, {"demo.yaml": opened}) as (url, _):
        yield url


@pytest.fixture
async def endorsing(
    env: dict[str, str], tmp_path: Path, catalog_dir: Path, clean: None
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """Its bank endorses ``send_money``'s recipient (an unendorsed one waits for an
    approver)."""
    files = {
        "demo.yaml": (catalog_dir / "demo.yaml").read_text(),
        "bank.yaml": ENDORSED.replace("MODE", "approve"),
    }
    async with serving(env, tmp_path, files) as started:
        yield started


@pytest.fixture
async def two_person(
    env: dict[str, str], tmp_path: Path, catalog_dir: Path, clean: None
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """Its refunds over 100.00 need two finance approvers (``approval.quorum: 2``)."""
    refunds = 'approvers: ["role:finance_approver"], ttl_s: 300,'
    text = (catalog_dir / "demo.yaml").read_text()
    files = {"demo.yaml": text.replace(refunds, refunds + " quorum: 2,")}
    async with serving(env, tmp_path, files) as started:
        yield started


async def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    """Always taken (the page must render); kept under ``docs/`` when asked to refresh."""
    keep = os.environ.get("TOOLGATE_SCREENSHOTS") == "1"
    await page.screenshot(path=str((ROOT / "docs" if keep else tmp_path) / name), full_page=True)


async def sign_in(page: Page, base_url: str, path: str, token: str) -> None:
    await page.goto(f"{base_url}{path}#token={token}")
    assert "token" not in page.url, "the token leaves the address at once"


async def pending_refund(flow: Flow, **extra: Any) -> str:
    proposal = await flow.propose("issue_refund", refund_args(150.0, **extra))
    await flow.dry_run(proposal["call_id"])
    return str(proposal["call_id"])


async def effects(providers: Providers) -> int:
    return (await providers.stats())["effects_by_path"].get(REFUNDS, 0)  # type: ignore[no-any-return]


async def test_an_approver_approves_a_pending_refund_and_the_agent_runs_it_once(
    page: Page,
    base_url: str,
    flow: Flow,
    token: Token,
    providers: Providers,
    tmp_path: Path,
) -> None:
    await sign_in(page, base_url, "/console", token(**BOB))
    await expect(page.get_by_text("Nothing is waiting for your decision.")).to_be_visible()
    call_id = await pending_refund(flow, note="customer called twice")

    row = page.locator(f'tr[data-call-id="{call_id}"]')
    await expect(row).to_be_visible(timeout=10_000)  # the inbox refreshes by itself
    await expect(row).to_contain_text("issue_refund")
    await expect(row).to_contain_text("alice")
    await expect(row).to_contain_text("order ord_1")
    await screenshot(page, "console-inbox.png", tmp_path)

    await row.get_by_role("link").click()
    await expect(page.locator("#state")).to_have_text("awaiting_approval")
    await expect(page.locator('[data-argument="amount"]')).to_contain_text("150")
    await expect(page.locator('[data-argument="note"]')).to_contain_text("customer called twice")
    await expect(page.locator("#preview")).to_contain_text('"new_balance": 100')
    facts = page.locator(".facts")
    await expect(facts).to_contain_text(call_id)
    await expect(facts).to_contain_text("order ord_1")
    await expect(page.locator("main")).not_to_contain_text("[object")
    approve = page.locator("#approve")
    await expect(approve).to_be_disabled()  # not before the approver confirms what they saw
    await page.locator("#confirm").check()
    await screenshot(page, "console-call.png", tmp_path)
    await approve.click()
    await expect(page.locator("#outcome")).to_contain_text("Approved")
    await expect(page.locator("#state")).to_have_text("approved", timeout=5_000)

    history = await flow.client.get(f"/calls/{call_id}", headers=flow.auth(**ALICE))
    approval = history.json()["approval"]
    assert approval["approver"] == "bob"
    assert approval["binding"]["snapshot_hash"] == history.json()["dry_runs"][-1]["snapshot_hash"]
    before = await effects(providers)
    args = refund_args(150.0, note="customer called twice")
    executed = await flow.execute(
        "issue_refund", args, new_key(), approval_id=approval["approval_id"]
    )
    assert executed.status_code == 200, executed.text
    assert executed.json()["status"] == "succeeded"
    assert await effects(providers) == before + 1


async def test_an_approver_rejects_with_a_comment_and_the_call_cannot_run(
    page: Page, base_url: str, flow: Flow, token: Token, providers: Providers, db: Any
) -> None:
    call_id = await pending_refund(flow)
    await sign_in(page, base_url, f"/console/calls/{call_id}", token(**BOB))
    await page.locator("#comment").fill("this order was already refunded by phone")
    await page.locator("#reject").click()
    await expect(page.locator("#outcome")).to_contain_text("Rejected")
    await expect(page.locator("#decided")).to_contain_text("already refunded by phone")

    stored = await db.fetch("SELECT decision, approver, comment FROM approvals")
    assert [tuple(r) for r in stored] == [
        ("reject", "bob", "this order was already refunded by phone")
    ]
    execute = await flow.execute("issue_refund", refund_args(150.0), new_key(), call_id=call_id)
    assert execute.status_code == 403
    assert await effects(providers) == 0


async def test_a_preview_that_changed_under_the_approver_is_not_approved(
    page: Page, base_url: str, flow: Flow, token: Token, db: asyncpg.Connection
) -> None:
    call_id = await pending_refund(flow)
    await sign_in(page, base_url, f"/console/calls/{call_id}", token(**BOB))
    await expect(page.locator("#preview")).to_contain_text('"refundable": 250')

    # Meanwhile another refund lands on the order and the call is previewed again.
    small = await flow.propose("issue_refund", refund_args(20.0))
    await flow.dry_run(small["call_id"])
    done = await flow.execute("issue_refund", refund_args(20.0), new_key())
    assert done.status_code == 200, done.text
    await flow.dry_run(call_id)

    await page.locator("#confirm").check()
    await page.locator("#approve").click()
    outcome = page.locator("#outcome")
    await expect(outcome).to_contain_text("changed after this page showed it")
    await expect(outcome).to_contain_text("Nothing was approved")
    await expect(page.locator("#approve")).to_be_disabled()
    assert await db.fetchval("SELECT count(*) FROM approvals") == 0

    await page.locator("#reload").click()
    changes = page.locator("#changes")
    await expect(changes).to_contain_text("refundable")
    await expect(changes).to_contain_text("250")
    await expect(changes).to_contain_text("230")


async def test_an_argument_holding_markup_is_shown_as_text_and_never_runs(
    page: Page, base_url: str, flow: Flow, token: Token
) -> None:
    call_id = await pending_refund(flow, note=SCRIPT)
    await sign_in(page, base_url, f"/console/calls/{call_id}", token(**BOB))
    note = page.locator('[data-argument="note"] code')
    await expect(note).to_have_text(SCRIPT)
    await page.wait_for_timeout(300)  # time for an injected onerror to fire, were there one
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("#arguments img, #arguments script").count() == 0


async def test_invisible_and_bidi_characters_in_an_argument_are_shown_as_markers(
    page: Page, base_url: str, flow: Flow, token: Token
) -> None:
    """A right-to-left override makes ``\u202emoc.live@ecila`` read "alice@evil.com", and a
    zero-width space is not seen at all: the approver must see what the value really holds."""
    call_id = await pending_refund(flow, note="receipt to \u202emoc.live@ecila\u200b")
    await sign_in(page, base_url, f"/console/calls/{call_id}", token(**BOB))
    note = page.locator('[data-argument="note"] code')
    await expect(note).to_have_text("receipt to U+202Emoc.live@ecilaU+200B")
    await expect(note.locator(".invisible")).to_have_count(2)
    assert "\u202e" not in await page.locator("main").inner_text()


async def test_an_argument_named_like_a_member_of_every_object_is_shown_as_sent(
    page: Page, open_schema: str, auth: Auth, token: Token
) -> None:
    """Where the schema lets a model add arguments, one named ``constructor`` or ``toString``
    reaches the provider like any other: the approver sees its value, not a blank."""
    async with httpx.AsyncClient(base_url=open_schema) as client:
        call_id = await pending_refund(Flow(client, auth), constructor="ord_2", toString="all")
    await sign_in(page, open_schema, f"/console/calls/{call_id}", token(**BOB))
    for name, value in (("constructor", "ord_2"), ("toString", "all")):
        shown = page.locator(f'[data-argument="{name}"]')
        await expect(shown.locator("code")).to_have_text(value)
        await expect(shown.locator(".badge")).to_have_count(0)


async def test_inbox_rows_tell_requests_apart_and_a_warned_preview_asks_twice(
    page: Page, base_url: str, flow: Flow, token: Token, providers: Providers, tmp_path: Path
) -> None:
    """Two refunds of one order showed as identical inbox rows, and a preview warning that
    the refund exceeds what is refundable was plain JSON that Approve went past. Rows show
    the values the catalog's ``approval.summary`` names; the call's page shows what would
    change (before → after) and the provider's warnings first, and asks to confirm them."""
    small = (await flow.propose("issue_refund", refund_args(130.0)))["call_id"]
    await flow.dry_run(small)
    large = await pending_refund(flow, note="goodwill")
    huge = (await flow.propose("issue_refund", refund_args(4900.0)))["call_id"]
    await flow.dry_run(huge)

    await sign_in(page, base_url, "/console", token(**BOB))
    rows = {c: page.locator(f'tr[data-call-id="{c}"]') for c in (small, large, huge)}
    await expect(rows[small]).to_contain_text("amount 130")
    await expect(rows[huge]).to_contain_text("amount 4900")
    await expect(rows[huge]).to_contain_text("currency EUR")
    await expect(rows[huge].locator(".badge")).to_have_text("warning")
    await expect(rows[small].locator(".badge")).to_have_count(0)
    await expect(page.locator("main")).not_to_contain_text("goodwill")  # never sensitive

    await rows[huge].get_by_role("link").click()
    await expect(page.locator("#warnings")).to_contain_text("exceeds what is still refundable")
    change = page.locator('#before-after tr[data-path="orders/ord_1/refundable"]')
    await expect(change.locator("td.old")).to_have_text("250")
    await expect(change.locator("td.new")).to_have_text("-4650")
    await expect(page.locator("#raw-preview")).not_to_have_attribute("open", "")
    approve = page.locator("#approve")
    await page.locator("#confirm").check()
    await expect(approve).to_be_disabled()  # the warnings are confirmed on their own
    await page.locator("#confirm-warnings").check()
    await expect(approve).to_be_enabled()
    await screenshot(page, "console-before-after.png", tmp_path)
    await page.locator("#raw-preview summary").click()
    await expect(page.locator("#preview")).to_contain_text('"exceeds_refundable": true')


async def test_an_approver_sees_which_value_nobody_vouched_for_and_may_vouch_for_it(
    page: Page,
    endorsing: tuple[str, httpx.AsyncClient],
    auth: Auth,
    token: Token,
    db: Any,
    tmp_path: Path,
) -> None:
    """A transfer to an IBAN the model joined from pieces is endorsed by nothing the user
    trusts: the inbox and the call say so (never with the value in the reason), and the
    approver may remember it, after which the same recipient needs no approval."""
    url, client = endorsing
    flow = Flow(client, auth)
    run = await flow.post("/runs", {"task": "Pay my December rent to the landlord."})
    recipient = ATTACKER_IBAN.replace(" ", "")
    args = {"account_id": "acc_1", "recipient": recipient, "amount": 10.0}
    proposal = (
        await flow.post(
            "/propose", {"tool": "send_money", "arguments": args, "run_id": run.json()["run_id"]}
        )
    ).json()
    assert proposal["next"] == "dry_run", proposal
    await flow.dry_run(proposal["call_id"])

    await sign_in(page, url, "/console", token(**BOB))
    row = page.locator(f'tr[data-call-id="{proposal["call_id"]}"]')
    await expect(row).to_contain_text("recipient unendorsed")
    await row.get_by_role("link").click()
    reason = page.locator('[data-endorsement="recipient"]')
    await expect(reason).to_contain_text("not endorsed")
    await expect(reason).not_to_contain_text(recipient)
    await expect(page.locator('[data-argument="recipient"]')).to_contain_text("unendorsed")
    await page.locator('[data-remember="recipient"]').check()
    await page.locator("#confirm").check()
    await screenshot(page, "console-endorsement.png", tmp_path)
    await page.locator("#approve").click()
    await expect(page.locator("#outcome")).to_contain_text("Approved")

    kinds = await db.fetch("SELECT tenant, kind, added_by FROM known_values")
    assert [tuple(k) for k in kinds] == [("acme", "payee", "bob")]
    again = await flow.post("/propose", {"tool": "send_money", "arguments": args})
    assert again.json()["endorsement"] == [
        {"argument": "recipient", "source": "known", "endorsed": True}
    ]
    assert again.json()["next"] == "execute"


async def test_an_auditor_searches_the_trail_and_verifies_the_chain(
    page: Page, base_url: str, flow: Flow, token: Token, tmp_path: Path
) -> None:
    call_id = await pending_refund(flow)
    await sign_in(page, base_url, "/console/audit", token(sub="erin", roles="auditor"))
    rows = page.locator("#results tbody tr")
    await expect(rows).to_have_count(2)  # proposed, dry_run
    await page.locator("#f-event").select_option("dry_run")
    await page.locator("#search").click()
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text(call_id)

    await page.locator("#verify").click()
    await expect(page.locator("#verify-result")).to_contain_text("Chain intact", timeout=10_000)
    await page.locator("#export").click()
    await expect(page.locator("#download")).to_contain_text(".ndjson")
    await expect(page.locator("main")).not_to_contain_text("null")
    await screenshot(page, "console-audit.png", tmp_path)

    await rows.first.get_by_role("link").click()
    await expect(page.locator("#timeline")).to_contain_text("dry_run")
    await expect(page.locator("#decide")).to_have_count(0)  # an auditor decides nothing


async def test_a_refund_two_approvers_must_agree_on_shows_one_of_two_and_waits(
    page: Page,
    two_person: tuple[str, httpx.AsyncClient],
    auth: Auth,
    token: Token,
    providers: Providers,
    tmp_path: Path,
) -> None:
    url, client = two_person
    flow = Flow(client, auth)
    call_id = await pending_refund(flow)
    fiona = {"sub": "fiona", "roles": "finance_approver"}
    await sign_in(page, url, "/console", token(**BOB))
    row = page.locator(f'tr[data-call-id="{call_id}"]')
    await expect(row).to_contain_text("0/2 approvals", timeout=10_000)
    await row.get_by_role("link").click()
    await expect(page.locator("#quorum")).to_contain_text("0 of the 2 approvers")
    await page.locator("#confirm").check()
    await page.locator("#approve").click()
    await expect(page.locator("#outcome")).to_contain_text("1/2 approvers")
    await expect(page.locator("#decided")).to_contain_text("Approved by 1 of 2", timeout=5_000)
    await expect(page.locator("#state")).to_have_text("awaiting_approval")
    await screenshot(page, "console-quorum.png", tmp_path)
    bob_inbox = await client.get("/approvals?status=pending", headers=auth(**BOB))
    assert bob_inbox.json()["items"] == []  # bob has decided; the other approver's turn
    early = await flow.execute(
        "issue_refund",
        refund_args(150.0),
        new_key(),
        approval_id=(await client.get(f"/calls/{call_id}", headers=auth(**BOB))).json()["approval"][
            "approval_id"
        ],
    )
    assert (early.status_code, early.json()["code"]) == (403, "approval_required")
    assert await effects(providers) == 0
    others = await client.get("/approvals?status=pending", headers=auth(**fiona))
    assert [(i["call_id"], i["approvals"]) for i in others.json()["items"]] == [(call_id, "1/2")]
