"""Webhooks: each event reaches the catalog's endpoints signed as Standard Webhooks, at
least once, across endpoint outages and restarts of toolgate, and never reaches a URL the
current catalog does not name."""

from __future__ import annotations

import asyncio
import secrets
import time
from base64 import b64encode
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from aiohttp import web
from standardwebhooks import Webhook

from app.catalog.loader import CatalogError, load
from app.webhooks import sender, signing
from tests.catalogs import BASE, write
from tests.conftest import ROOT, Providers, make_env, running_app, serving
from tests.flows import Flow, new_key, refund_args

SECRET = "whsec_" + b64encode(secrets.token_bytes(32)).decode()
EVENTS = ["approval.requested", "approval.decided", "call.executed", "run.ended"]


class Receiver:
    """A webhook endpoint that verifies every signature, answers 503 while ``down``, and
    keeps what it accepted."""

    def __init__(self) -> None:
        self.down = False
        self.page = b""
        """What an accepting answer carries (a 204 when empty)."""
        self.refused = 0
        self.accepted: list[dict[str, Any]] = []
        self.ids: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        payload = Webhook(SECRET).verify(body, dict(request.headers))
        if self.down:
            self.refused += 1
            return web.Response(status=503)
        self.accepted.append(payload)
        self.ids.append(request.headers["webhook-id"])
        return web.Response(status=200, body=self.page) if self.page else web.Response(status=204)

    def types(self) -> list[str]:
        return sorted(p["type"] for p in self.accepted)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    endpoint = Receiver()
    application = web.Application()
    application.router.add_post("/hooks", endpoint.handle)
    async with serving(application) as url:
        yield endpoint, f"{url}/hooks"


def catalog_with(tmp_path: Path, url: str | None) -> str:
    """The demo catalog in a directory of its own, telling ``url`` of every event."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "demo.yaml").write_text((ROOT / "catalog" / "demo.yaml").read_text())
    if url is not None:
        (tmp_path / "notify.yaml").write_text(
            f"notify:\n  - url: {url}\n    events: {EVENTS}\n    secret_env: HOOK_SECRET\n"
        )
    return str(tmp_path)


@pytest.fixture
def hook_env(
    lone_database: str, redis_url: str, providers_url: str, providers: Providers
) -> dict[str, str]:
    """Settings of an app of its own, and the providers in their seed state (the refunds
    these tests make would otherwise exceed what an earlier test left refundable)."""
    return make_env(lone_database, redis_url, providers_url, HOOK_SECRET=SECRET, S=SECRET)


@pytest.fixture
def notifying(
    hook_env: dict[str, str], receiver: tuple[Receiver, str], tmp_path: Path
) -> tuple[Receiver, dict[str, str]]:
    """The receiver, and the settings of an app that tells it of every event."""
    endpoint, url = receiver
    return endpoint, {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path, url)}


async def outbox(database_url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return list(await conn.fetch("SELECT * FROM webhook_outbox ORDER BY created_at"))
    finally:
        await conn.close()


async def until(condition: Any, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture(autouse=True)
def quick_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sender, "EVERY_S", 0.05)
    monkeypatch.setattr(sender, "BACKOFF_S", 0.1)


async def approved_refund_executed(flow: Flow) -> None:
    """approval.requested, approval.decided and call.executed, once each."""
    _proposal, approval_id = await flow.approved_refund()
    response = await flow.execute("issue_refund", refund_args(), new_key(), approval_id=approval_id)
    assert response.status_code == 200, response.text


async def run_ended(client: httpx.AsyncClient, auth: Any) -> None:
    """A run started and finished: its ``run.ended`` event is in the outbox."""
    run = await client.post("/runs", json={}, headers=auth())
    assert run.status_code == 200, run.text
    ended = await client.post(
        f"/runs/{run.json()['run_id']}/finish", json={"status": "completed"}, headers=auth()
    )
    assert ended.status_code == 200, ended.text


def test_own_signatures_verify_with_the_reference_library() -> None:
    headers = signing.headers(SECRET, "msg_1", 1_700_000_000, b'{"a":1}')
    with pytest.raises(Exception, match="too old"):
        Webhook(SECRET).verify(b'{"a":1}', headers)  # verified up to the timestamp check
    fresh = signing.headers(SECRET, "msg_1", int(time.time()), b'{"a":1}')
    assert Webhook(SECRET).verify(b'{"a":1}', fresh) == {"a": 1}
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(SECRET).verify(b'{"a":2}', fresh)


async def test_every_event_reaches_the_endpoint_signed(
    notifying: tuple[Receiver, dict[str, str]],
    auth: Any,
    lone_database: str,
) -> None:
    endpoint, env = notifying
    async with running_app(env) as client:
        flow = Flow(client, auth)
        await approved_refund_executed(flow)
        await run_ended(client, auth)
        await until(lambda: len(endpoint.accepted) == 4)
        await asyncio.sleep(0.3)  # nothing more comes
        for _ in range(200):  # and the sender has stored each delivery it made
            rows = await outbox(lone_database)
            if all(r["delivered_at"] is not None for r in rows):
                break
            await asyncio.sleep(0.05)
    assert endpoint.types() == sorted(EVENTS)
    executed = next(p for p in endpoint.accepted if p["type"] == "call.executed")
    assert executed["data"]["status"] == "succeeded"
    assert executed["data"]["actor"] == "alice"
    assert "arguments" not in executed["data"]
    assert [r["delivered_at"] is not None for r in rows] == [True] * 4
    assert sorted(r["id"] for r in rows) == sorted(endpoint.ids)


async def test_approval_requested_links_to_the_console_and_names_no_argument_value(
    notifying: tuple[Receiver, dict[str, str]], auth: Any
) -> None:
    """Enough to tell an approver in a chat message which call waits and where to decide
    it: its tool, actor, target and impact, and the console's page, built from
    TOOLGATE_PUBLIC_URL; never the arguments (a refund's note may be sensitive)."""
    endpoint, env = notifying
    public = {**env, "TOOLGATE_PUBLIC_URL": "https://toolgate.example.com/gate/"}
    async with running_app(public) as client:
        flow = Flow(client, auth)
        proposal = await flow.propose("issue_refund", refund_args(150.0, note="secret note"))
        await flow.dry_run(proposal["call_id"])
        await until(lambda: len(endpoint.accepted) == 1)
    [requested] = endpoint.accepted
    call_id = proposal["call_id"]
    assert requested["type"] == "approval.requested"
    assert requested["data"] == {
        "call_id": call_id,
        "tool": "issue_refund",
        "tenant": "acme",
        "actor": "alice",
        "run_id": None,
        "status": "awaiting_approval",
        "target": {"type": "order", "id": "ord_1"},
        "impact": "high",
        "console_url": f"https://toolgate.example.com/gate/console/calls/{call_id}",
    }


async def test_an_endpoint_that_is_down_for_a_while_gets_the_event_once_it_is_back(
    notifying: tuple[Receiver, dict[str, str]],
    auth: Any,
    lone_database: str,
) -> None:
    endpoint, env = notifying
    endpoint.down = True
    async with running_app(env) as client:
        await run_ended(client, auth)
        await until(lambda: endpoint.refused >= 3)
        (row,) = await outbox(lone_database)
        assert row["delivered_at"] is None
        assert row["last_error"] == "answered 503"
        endpoint.down = False
        await until(lambda: len(endpoint.accepted) == 1)
        # The endpoint has its answer before the sender stores it: wait for that too (a busy
        # machine once stopped the app in between, and the check below saw no delivery).
        for _ in range(200):
            (row,) = await outbox(lone_database)
            if row["delivered_at"] is not None:
                break
            await asyncio.sleep(0.05)
    assert endpoint.types() == ["run.ended"]
    assert row["delivered_at"] is not None
    assert row["attempts"] == endpoint.refused + 1


async def test_a_2xx_with_a_large_page_is_delivered_once(
    notifying: tuple[Receiver, dict[str, str]],
    auth: Any,
    lone_database: str,
) -> None:
    """A receiver that answers a big HTML page with its 200 received the event: only the
    status counts, its page is never read (and never makes the event come again)."""
    endpoint, env = notifying
    endpoint.page = b"<html>" + b"x" * (200 << 10) + b"</html>"
    async with running_app(env) as client:
        await run_ended(client, auth)
        await until(lambda: len(endpoint.accepted) == 1)
        await asyncio.sleep(0.5)  # several passes and backoffs: nothing is sent again
    assert len(endpoint.accepted) == 1
    (row,) = await outbox(lone_database)
    assert (row["delivered_at"] is not None, row["attempts"], row["last_error"]) == (True, 1, None)


async def test_an_event_survives_a_restart_of_toolgate_before_delivery(
    notifying: tuple[Receiver, dict[str, str]],
    auth: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint, env = notifying
    monkeypatch.setattr(sender, "EVERY_S", 3600.0)  # the first instance never sends
    async with running_app(env) as client:
        await approved_refund_executed(Flow(client, auth))
    assert endpoint.accepted == []
    monkeypatch.setattr(sender, "EVERY_S", 0.05)
    async with running_app(env):
        await until(lambda: len(endpoint.accepted) == 3)
    assert endpoint.types() == ["approval.decided", "approval.requested", "call.executed"]


async def test_a_url_removed_from_the_catalog_after_the_event_is_never_sent_to(
    hook_env: dict[str, str],
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    auth: Any,
    lone_database: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the event is older than ``DROP_AFTER_S`` (no other instance is still to load a
    catalog that names the URL), it is dropped unsent."""
    endpoint, url = receiver
    monkeypatch.setattr(sender, "EVERY_S", 3600.0)
    monkeypatch.setattr(sender, "DROP_AFTER_S", 0.5)
    with_hook = {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path / "a", url)}
    async with running_app(with_hook) as client:
        await approved_refund_executed(Flow(client, auth))
    assert len(await outbox(lone_database)) == 3
    monkeypatch.setattr(sender, "EVERY_S", 0.05)
    without = {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path / "b", None)}
    async with running_app(without):
        for _ in range(100):
            if not await outbox(lone_database):
                break
            await asyncio.sleep(0.05)
    assert await outbox(lone_database) == []
    assert endpoint.accepted == []
    assert endpoint.refused == 0


NOTIFY = "notify:\n  - {url: %s, events: %s, secret_env: %s}\n"


@pytest.mark.parametrize(
    ("entry", "env", "path", "message"),
    [
        (("ftp://h/x", "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "http(s) URL"),
        (("http:///x", "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "http(s) URL"),
        (('"http://h/a b"', "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "percent"),
        (('"http://h/a\\\\b"', "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "percent"),
        (('"http://h\\\\x"', "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "http(s) URL"),
        (('"http://[::1/x"', "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "http(s) URL"),
        (("http://h:99999/x", "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "http(s) URL"),
        (("http://h:x/x", "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "http(s) URL"),
        (('"${HOOK_URL}"', "[run.ended]", "S"), {"S": SECRET}, "notify.0.url", "HOOK_URL"),
        (("http://h/x", "[call.started]", "S"), {"S": SECRET}, "notify.0.events.0", "Input"),
        (("http://h/x", "[]", "S"), {"S": SECRET}, "notify.0.events", "at least 1"),
        (("http://h/x", "[run.ended]", "S"), {}, "notify.0.secret_env", "not set"),
        (("http://h/x", "[run.ended]", "S"), {"S": "hunter2"}, "notify.0.secret_env", "whsec_"),
        (("http://h/x", "[run.ended]", "S"), {"S": "whsec_c2hvcnQ="}, "notify.0.secret_env", "24"),
        (("http://h/x", "[run.ended]", "S"), {"S": "whsec_!!"}, "notify.0.secret_env", "whsec_"),
    ],
)
def test_a_notify_entry_that_cannot_be_delivered_refuses_the_catalog(
    tmp_path: Path, entry: tuple[str, str, str], env: dict[str, str], path: str, message: str
) -> None:
    with pytest.raises(CatalogError) as refused:
        load(write(tmp_path, BASE + NOTIFY % entry), env)
    (problem,) = refused.value.problems
    assert ".".join(map(str, problem.path)) == path
    assert message in problem.message


def test_notify_urls_and_secrets_come_from_the_environment(tmp_path: Path) -> None:
    text = BASE + NOTIFY % ('"${HOOK_URL}"', "[run.ended, call.executed]", "S")
    catalog = load(write(tmp_path, text), {"S": SECRET, "HOOK_URL": "https://hooks.example/t"})
    assert catalog.subscribers("run.ended") == ("https://hooks.example/t",)
    assert catalog.subscribers("approval.requested") == ()
    assert catalog.webhooks[0].secret == SECRET
    assert SECRET not in repr(catalog.webhooks[0])


def test_a_url_named_by_two_notify_entries_refuses_the_catalog(tmp_path: Path) -> None:
    """Deliveries are queued by URL and signed with the first entry naming it: a second
    entry's events would be signed with the first entry's secret, refused by the receiver
    and retried for ever."""
    second = "  - {url: http://h/x, events: [call.executed], secret_env: T}\n"
    text = BASE + NOTIFY % ("http://h/x", "[run.ended]", "S") + second
    with pytest.raises(CatalogError) as refused:
        load(write(tmp_path, text), {"S": SECRET, "T": SECRET.replace("whsec_", "whsec_A")})
    (problem,) = refused.value.problems
    assert problem.path == ("notify", 1, "url")
    assert "earlier entry" in problem.message


def test_only_one_file_of_a_catalog_directory_may_list_notify(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    write(tmp_path, NOTIFY % ("http://h/a", "[run.ended]", "S"), "a.yaml")
    write(tmp_path, NOTIFY % ("http://h/b", "[run.ended]", "S"), "b.yaml")
    with pytest.raises(CatalogError) as refused:
        load(tmp_path, {"S": SECRET})
    (problem,) = refused.value.problems
    assert problem.path == ("notify",)
    assert problem.message == "defined more than once"


async def test_an_endpoint_that_hangs_does_not_hold_up_deliveries_to_the_others(
    hook_env: dict[str, str],
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    auth: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subscriber that never answers is waited for up to the timeout on every event; the
    other endpoints' events go out meanwhile, not once it has timed out."""
    monkeypatch.setattr(sender, "TIMEOUT_S", 5.0)
    endpoint, url = receiver
    hanging: list[web.Request] = []
    released = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        hanging.append(request)
        await released.wait()
        return web.Response(status=204)

    application = web.Application()
    application.router.add_post("/slow", hang)
    async with serving(application) as slow:
        env = {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path, url)}
        with (tmp_path / "notify.yaml").open("a") as notify:
            notify.write(f"  - {{url: {slow}/slow, events: [run.ended], secret_env: S}}\n")
        try:
            async with running_app(env) as client:
                await run_ended(client, auth)
                await until(lambda: len(endpoint.accepted) == 1 and len(hanging) == 1)
                await run_ended(client, auth)
                ended = time.monotonic()
                await until(lambda: len(endpoint.accepted) == 2, seconds=4.0)
                assert time.monotonic() - ended < 2.0
        finally:
            released.set()


async def test_a_secret_in_a_notify_url_never_reaches_the_log(
    hook_env: dict[str, str],
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    auth: Any,
    lone_database: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A URL can carry a credential (userinfo, or a token in its path, as many receivers
    issue them), which is why it may come from the environment: logs name only its host."""
    monkeypatch.setattr(sender, "DROP_AFTER_S", 0.0)
    endpoint, url = receiver
    endpoint.down = True
    secret_url = url.replace("http://", "http://hook:pa55-in-userinfo@") + "?token=t0ken-in-query"
    caplog.set_level("INFO", logger="toolgate")
    env = {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path / "a", secret_url)}
    async with running_app(env) as client:
        await run_ended(client, auth)
        await until(lambda: endpoint.refused >= 2)
    async with running_app({**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path / "b", None)}):
        await until(lambda: "dropped" in caplog.text)
    assert "answered 503" in caplog.text
    assert url.removeprefix("http://").split("/")[0] in caplog.text
    assert "pa55-in-userinfo" not in caplog.text
    assert "t0ken-in-query" not in caplog.text


async def test_a_secret_in_a_notify_url_stays_out_of_the_log_when_the_answer_is_malformed(
    hook_env: dict[str, str], tmp_path: Path, auth: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The transport's error for an answer it cannot parse quotes the URL it requested:
    what is logged of it names the receiver by its origin only."""
    answered = 0

    async def garbled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nnot a header\r\n\r\n")
        await writer.drain()
        answered += 1
        writer.close()

    server = await asyncio.start_server(garbled, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    secret_url = f"http://hook:pa55-in-userinfo@127.0.0.1:{port}/t0ken-in-path?token=t0ken-in-query"
    caplog.set_level("INFO", logger="toolgate")
    env = {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path, secret_url)}
    async with server, running_app(env) as client:
        await run_ended(client, auth)
        await until(lambda: answered >= 1 and "failed" in caplog.text)
    assert f"http://127.0.0.1:{port}" in caplog.text
    assert "pa55-in-userinfo" not in caplog.text
    assert "t0ken-in" not in caplog.text


async def test_an_instance_whose_catalog_does_not_name_a_url_yet_leaves_its_events_be(
    hook_env: dict[str, str],
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    auth: Any,
    lone_database: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While catalogs are reloaded one instance at a time, an event queued by an instance
    that already names a new endpoint is claimed by one that does not yet: it is put off,
    not deleted, and the endpoint gets it from an instance that knows it."""
    endpoint, url = receiver
    monkeypatch.setattr(sender, "EVERY_S", 3600.0)
    newer = {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path / "newer", url)}
    async with running_app(newer) as client:
        await run_ended(client, auth)
    monkeypatch.setattr(sender, "EVERY_S", 0.05)
    older = {**hook_env, "TOOLGATE_CATALOG": catalog_with(tmp_path / "older", None)}
    async with running_app(older):
        for _ in range(100):
            rows = await outbox(lone_database)
            if not rows or rows[0]["attempts"] >= 2:
                break
            await asyncio.sleep(0.05)
    (row,) = await outbox(lone_database)
    assert (row["delivered_at"], row["attempts"] >= 2) == (None, True)
    assert endpoint.accepted == []
    async with running_app(newer):
        await until(lambda: len(endpoint.accepted) == 1)
    assert endpoint.types() == ["run.ended"]
