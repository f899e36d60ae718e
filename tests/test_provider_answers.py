"""Provider answers that JSON allows but PostgreSQL or RFC 8785 do not take as they are: a
NUL in a text, an integer beyond ±(2**53-1), a ``provider_status`` that is no HTTP status of
its outcome.
A mutation answered that way ran once; toolgate must store and answer its outcome (or, when
it cannot, the 504 of an unknown outcome), never a 500, and a preview answered that way is
still a preview."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from app.calls import reconciler
from app.state import AppState
from tests.conftest import running_app, serving
from tests.flows import ALICE, Auth, Flow, new_key

CATALOG = """
version: "answers-1"
providers:
  odd: {base_url: "${ODD_URL}", timeout_s: 1}
tools:
  make_thing:
    mutation: true
    provider: odd
    execute: {method: POST, path: /things}
    reconcile: {method: GET, path: "/things/operations/{operation_id}"}
    impact: low
    parameters:
      type: object
      additionalProperties: false
      required: [name]
      properties:
        name: {type: string}
  approve_thing:
    mutation: true
    provider: odd
    execute: {method: POST, path: /things}
    dry_run: {method: POST, path: /things/preview}
    impact: high
    approval: {approvers: [actor]}
    parameters:
      type: object
      additionalProperties: false
      required: [name]
      properties:
        name: {type: string}
"""

NUL_TEXT = '"a\\u0000b"'
BIG_INTEGER = str(2**53 + 1)


class Odd:
    """A provider that deduplicates on ``Idempotency-Key``, counts its effects, and answers
    with the raw JSON texts it is given."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.answers = {"execute": "{}", "preview": "{}", "reconcile": "{}"}
        self.status = {"execute": 201}
        self.done: set[str] = set()

    def app(self) -> web.Application:
        async def execute(request: web.Request) -> web.Response:
            key = request.headers["Idempotency-Key"]
            if key not in self.done:
                self.done.add(key)
                self.effects[key] += 1
            return self._answer("execute", self.status["execute"])

        async def preview(request: web.Request) -> web.Response:
            return self._answer("preview", 200)

        async def reconcile(request: web.Request) -> web.Response:
            if request.match_info["operation_id"] not in self.done:
                return web.json_response({"error": "not_found"}, status=404)
            return self._answer("reconcile", 200)

        app = web.Application()
        app.router.add_post("/things", execute)
        app.router.add_post("/things/preview", preview)
        app.router.add_get("/things/operations/{operation_id}", reconcile)
        return app

    def _answer(self, what: str, status: int) -> web.Response:
        return web.Response(status=status, text=self.answers[what], content_type="application/json")


@pytest.fixture
async def odd() -> AsyncIterator[tuple[Odd, str]]:
    provider = Odd()
    async with serving(provider.app()) as url:
        yield provider, url


@pytest.fixture
async def odd_flow(
    env: dict[str, str],
    lone_database: str,
    tmp_path: Path,
    odd: tuple[Odd, str],
    auth: Auth,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Flow]:
    """An app on a database of its own whose background passes never come round: a test
    runs a pass itself."""
    monkeypatch.setattr(reconciler, "EVERY_S", 3600.0)
    (tmp_path / "answers.yaml").write_text(CATALOG)
    app_env = {"TOOLGATE_CATALOG": str(tmp_path), "ODD_URL": odd[1]}
    async with running_app({**env, **app_env, "TOOLGATE_DATABASE_URL": lone_database}) as c:
        yield Flow(c, auth)


@pytest.fixture
async def db(lone_database: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(lone_database)
    yield conn
    await conn.close()


async def test_a_result_with_a_nul_is_stored_answered_and_replayed(
    odd_flow: Flow, odd: tuple[Odd, str], db: asyncpg.Connection
) -> None:
    provider = odd[0]
    provider.answers["execute"] = '{"id": ' + NUL_TEXT + ', "n": ' + BIG_INTEGER + "}"
    key = new_key()
    first = await odd_flow.execute("make_thing", {"name": "x"}, key)
    assert first.status_code == 200, first.text
    body: dict[str, Any] = first.json()
    assert (body["status"], body["provider_status"]) == ("succeeded", 201)
    assert body["result"]["id"] == "a\\u0000b"
    again = await odd_flow.execute("make_thing", {"name": "x"}, key)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == {**body, "replayed": True}
    assert list(provider.effects.values()) == [1]
    assert await db.fetchval("SELECT state FROM executions") == "succeeded"


async def test_a_preview_with_a_nul_and_a_large_integer_is_previewed_approved_and_rechecked(
    odd_flow: Flow, odd: tuple[Odd, str], db: asyncpg.Connection
) -> None:
    provider = odd[0]
    provider.answers["preview"] = '{"id": ' + NUL_TEXT + ', "n": ' + BIG_INTEGER + "}"
    proposal = await odd_flow.propose("approve_thing", {"name": "x"})
    preview = await odd_flow.post("/dry-run", {"call_id": proposal["call_id"]})
    assert preview.status_code == 200, preview.text
    assert preview.json()["snapshot"] == {"id": "a\\u0000b", "n": BIG_INTEGER}
    approval = await odd_flow.approve(proposal["call_id"], preview.json()["snapshot_hash"], ALICE)
    assert approval.status_code == 200, approval.text
    done = await odd_flow.execute(
        "approve_thing", {"name": "x"}, new_key(), approval_id=approval.json()["approval_id"]
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded"
    assert list(provider.effects.values()) == [1]
    assert await db.fetchval("SELECT count(*) FROM dry_runs") == 1


def state_of(flow: Flow) -> AppState:
    return flow.client._transport.app.state.toolgate  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("provider_status", [str(2**32), "true", "404"])
@pytest.mark.parametrize("by", ["retry", "reconciler"])
async def test_a_reconciled_status_that_is_no_http_status_is_recorded_as_the_default(
    odd_flow: Flow, odd: tuple[Odd, str], db: asyncpg.Connection, provider_status: str, by: str
) -> None:
    """A reconcile answer's ``provider_status`` that is no HTTP status of the outcome it
    reports (too large for any status, not a number, a 4xx success) is as good as none:
    ``succeeded`` is recorded as 200."""
    provider = odd[0]
    provider.status["execute"] = 500
    key = new_key()
    first = await odd_flow.execute("make_thing", {"name": "x"}, key)
    assert (first.status_code, first.json()["status"]) == (504, "unknown"), first.text
    provider.answers["reconcile"] = (
        '{"status": "succeeded", "provider_status": ' + provider_status + ', "result": {"id": 1}}'
    )
    if by == "retry":
        retry = await odd_flow.execute("make_thing", {"name": "x"}, key)
        assert retry.status_code == 200, retry.text
        assert (retry.json()["status"], retry.json()["provider_status"]) == ("succeeded", 200)
        assert retry.json()["result"] == {"id": 1}
    else:
        await db.execute("UPDATE executions SET updated_at = now() - interval '1 hour'")
        assert await reconciler.reconcile_stale(state_of(odd_flow)) == 1
    row = await db.fetchrow("SELECT state, provider_status FROM executions")
    assert row is not None
    assert (row["state"], row["provider_status"]) == ("succeeded", 200)
    assert list(provider.effects.values()) == [1]


@pytest.mark.parametrize("text", ["", "<html>Service paused</html>", "null", "[" * 200 + "]" * 200])
async def test_a_preview_without_a_json_body_is_a_502_never_a_null_snapshot_to_approve(
    odd_flow: Flow, odd: tuple[Odd, str], db: asyncpg.Connection, text: str
) -> None:
    """A 2xx preview with nothing to show (an empty body, a page that is not JSON, ``null``,
    JSON nested past what toolgate reads) would be a ``null`` snapshot: an approver would
    approve blind, and every recheck of it would hash the same, so no change in the world
    could ever make that approval stale. It is no preview: a 502, and nothing stored."""
    odd[0].answers["preview"] = text
    proposal = await odd_flow.propose("approve_thing", {"name": "x"})
    preview = await odd_flow.post("/dry-run", {"call_id": proposal["call_id"]})
    assert preview.status_code == 502, preview.text
    assert preview.json()["code"] == "provider_unavailable"
    assert await db.fetchval("SELECT count(*) FROM dry_runs") == 0
    assert await db.fetchval("SELECT state FROM calls") == "proposed"
