"""Provider answers over the provider's ``max_response_bytes`` are never read whole.

The provider here streams 50 MB; the test process's peak RSS (which the app shares) must not
grow by anything near that. A read, a dry-run or an owner lookup answered that way is an
outage (502); a mutation's answer is an unknown outcome (504 with the operation id), which
the provider's reconcile endpoint resolves.

An answer nested deeper than toolgate can carry through its own answers and records is, like
one that is not JSON, a ``null`` body: the call is recorded and answered, never a 500.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from tests.conftest import running_app
from tests.flows import Auth, Flow, new_key

HUGE = 50 * 1024 * 1024
CHUNK = b" " * 65536
MiB = 1024 * 1024
DEPTHS = [300, 600]
"""Past what orjson writes (254 levels), and past what Python's recursion limit walks."""

CATALOG = """
version: "large-1"
providers:
  huge: {base_url: "${LARGE_URL}", timeout_s: 20}
  roomy: {base_url: "${LARGE_URL}", timeout_s: 20, max_response_bytes: 3145728}
resources:
  blob:
    provider: huge
    owner: {method: GET, path: "/blobs/{id}/owner"}
tools:
  read_blob:
    mutation: false
    provider: huge
    execute: {method: GET, path: /blob}
    access: {roles: [support]}
    parameters:
      type: object
      additionalProperties: false
      properties:
        declared: {type: boolean}
  read_roomy:
    mutation: false
    provider: roomy
    execute: {method: GET, path: /sized}
    access: {roles: [support]}
    parameters: {type: object, additionalProperties: false, properties: {}}
  read_owned_blob:
    mutation: false
    provider: huge
    execute: {method: GET, path: /blob}
    access: {roles: [support]}
    parameters:
      type: object
      additionalProperties: false
      required: [blob_id]
      properties:
        blob_id: {type: string, x-resource: blob}
  read_deep:
    mutation: false
    provider: huge
    execute: {method: GET, path: /deep}
    access: {roles: [support]}
    parameters: &deep {type: object, required: [depth], properties: {depth: {type: integer}}}
  write_deep:
    mutation: true
    provider: huge
    execute: {method: POST, path: /deep}
    impact: low
    access: {roles: [support]}
    parameters: *deep
  write_blob:
    mutation: true
    provider: huge
    execute: {method: POST, path: /blob}
    dry_run: {method: POST, path: /blob/preview}
    reconcile: {method: GET, path: "/blob/operations/{operation_id}"}
    impact: low
    access: {roles: [support]}
    parameters:
      type: object
      additionalProperties: false
      required: [name]
      properties:
        name: {type: string}
"""


async def stream(request: web.Request, size: int = HUGE) -> web.StreamResponse:
    """``size`` bytes written as they are sent, from one reused chunk: the server side
    holds no more than a chunk. ``?declared=true`` sends a Content-Length up front."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    if request.query.get("declared") == "true":
        response.content_length = size
    await response.prepare(request)
    sent = 0
    try:
        while sent < size:
            await response.write(CHUNK[: size - sent])
            sent += len(CHUNK)
    except (ConnectionError, RuntimeError):  # the client gave up, as it should
        return response
    await response.write_eof()
    return response


@pytest.fixture
async def large_url() -> AsyncIterator[tuple[str, Counter[str]]]:
    """A provider whose answers are 50 MB, except reconcile; counts its effects."""
    effects: Counter[str] = Counter()
    operations: set[str] = set()

    async def write(request: web.Request) -> web.StreamResponse:
        key = request.headers["Idempotency-Key"]
        if key not in operations:
            operations.add(key)
            effects[request.path] += 1
        return await stream(request)

    async def reconcile(request: web.Request) -> web.Response:
        if request.match_info["operation_id"] not in operations:
            return web.json_response({"error": "not_found"}, status=404)
        summary = {"id": "blob_1", "status": "stored"}
        return web.json_response({"status": "succeeded", "provider_status": 201, "result": summary})

    async def deep(request: web.Request) -> web.Response:
        if request.method == "GET":
            depth = int(request.query["depth"])
        else:
            depth = (await request.json())["depth"]
            key = request.headers["Idempotency-Key"]
            if key not in operations:
                operations.add(key)
                effects[request.path] += 1
        nested = b"[" * depth + b"]" * depth
        return web.Response(body=b'{"tree": ' + nested + b"}", content_type="application/json")

    async def sized(request: web.Request) -> web.StreamResponse:
        return await stream(request, 2 * MiB)

    app = web.Application()
    app.router.add_get("/blob", stream)
    app.router.add_get("/blobs/{id}/owner", stream)
    app.router.add_post("/blob/preview", stream)
    app.router.add_post("/blob", write)
    app.router.add_get("/blob/operations/{operation_id}", reconcile)
    app.router.add_get("/sized", sized)
    app.router.add_get("/deep", deep)
    app.router.add_post("/deep", deep)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", effects
    await runner.cleanup()


@pytest.fixture
async def large(
    env: dict[str, str], tmp_path: Path, large_url: tuple[str, Counter[str]], auth: Auth
) -> AsyncIterator[Flow]:
    (tmp_path / "large.yaml").write_text(CATALOG)
    app_env = {**env, "TOOLGATE_CATALOG": str(tmp_path), "LARGE_URL": large_url[0]}
    async with running_app(app_env) as client:
        yield Flow(client, auth)


def _kib(field: str) -> int:
    with open("/proc/self/status") as status:
        found = re.search(rf"^{field}:\s+(\d+) kB$", status.read(), re.MULTILINE)
    assert found is not None
    return int(found.group(1))


class Peak:
    """The growth of this process's peak RSS from now on (Linux: clear_refs resets it)."""

    def __init__(self) -> None:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        self.start = _kib("VmRSS")

    def growth(self) -> int:
        return (_kib("VmHWM") - self.start) * 1024


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "declared_length"])
async def test_a_read_answered_with_50_mb_is_a_502_and_is_not_buffered(
    large: Flow, db: asyncpg.Connection, declared: bool
) -> None:
    peak = Peak()
    response = await large.execute("read_blob", {"declared": declared}, None)
    assert peak.growth() < 16 * MiB, f"peak RSS grew by {peak.growth() // MiB} MiB"
    assert response.status_code == 502, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "provider_unavailable"
    assert "too large" in response.json()["detail"]
    assert await db.fetchval("SELECT state FROM calls") == "failed"


async def test_an_owner_lookup_answered_with_50_mb_is_a_502(
    large: Flow, db: asyncpg.Connection
) -> None:
    peak = Peak()
    response = await large.post(
        "/propose", {"tool": "read_owned_blob", "arguments": {"blob_id": "b1"}}
    )
    assert peak.growth() < 16 * MiB, f"peak RSS grew by {peak.growth() // MiB} MiB"
    assert (response.status_code, response.json()["code"]) == (502, "provider_unavailable")
    assert "too large" in response.json()["detail"]


async def test_a_dry_run_answered_with_50_mb_is_a_502(large: Flow, db: asyncpg.Connection) -> None:
    proposal = await large.propose("write_blob", {"name": "n"})
    peak = Peak()
    response = await large.post("/dry-run", {"call_id": proposal["call_id"]})
    assert peak.growth() < 16 * MiB, f"peak RSS grew by {peak.growth() // MiB} MiB"
    assert (response.status_code, response.json()["code"]) == (502, "provider_unavailable")
    assert "too large" in response.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM dry_runs") == 0


async def test_a_mutation_answered_with_50_mb_is_unknown_until_reconciled(
    large: Flow, large_url: tuple[str, Counter[str]], db: asyncpg.Connection
) -> None:
    effects = large_url[1]
    key = new_key()
    peak = Peak()
    first = await large.execute("write_blob", {"name": "n"}, key)
    assert peak.growth() < 16 * MiB, f"peak RSS grew by {peak.growth() // MiB} MiB"
    assert first.status_code == 504, first.text
    problem: dict[str, Any] = first.json()
    assert (problem["code"], problem["status"]) == ("provider_timeout", "unknown")
    operation_id = problem["operation_id"]
    state = "SELECT state FROM executions WHERE operation_id = $1"
    assert await db.fetchval(state, operation_id) == "unknown"
    assert effects["/blob"] == 1
    retry = await large.execute("write_blob", {"name": "n"}, key)
    assert retry.status_code == 200, retry.text
    assert (retry.json()["status"], retry.json()["provider_status"]) == ("succeeded", 201)
    assert retry.json()["result"] == {"id": "blob_1", "status": "stored"}
    assert effects["/blob"] == 1
    rows = await db.fetch("SELECT event, code FROM audit_events WHERE event <> 'proposed'")
    assert [tuple(r) for r in rows] == [("failed", "provider_timeout"), ("reconciled", None)]


async def test_max_response_bytes_raises_the_limit_for_one_provider(large: Flow) -> None:
    """``roomy`` allows 3 MiB: its 2 MiB answer is read (over the 1 MiB default)."""
    response = await large.execute("read_roomy", {}, None)
    assert response.status_code == 200, response.text
    assert response.json()["provider_status"] == 200


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_mutation_answered_with_a_deeply_nested_body_is_recorded_once_with_a_null_result(
    large: Flow, large_url: tuple[str, Counter[str]], db: asyncpg.Connection, depth: int
) -> None:
    """The provider acted: the answer says so (not a 500 that hides the operation, after
    which an agent would try again under a new key), and a retry replays it."""
    effects = large_url[1]
    key = new_key()
    first = await large.execute("write_deep", {"depth": depth}, key)
    assert first.status_code == 200, first.text
    assert (first.json()["status"], first.json()["result"]) == ("succeeded", None)
    retry = await large.execute("write_deep", {"depth": depth}, key)
    assert retry.status_code == 200, retry.text
    assert retry.json()["replayed"] is True
    assert effects["/deep"] == 1
    assert await db.fetchval("SELECT state FROM executions") == "succeeded"
    rows = await db.fetch("SELECT event FROM audit_events ORDER BY seq")
    assert [r["event"] for r in rows] == ["executed", "replayed"]


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_read_answered_with_a_deeply_nested_body_is_recorded_with_a_null_result(
    large: Flow, db: asyncpg.Connection, depth: int
) -> None:
    response = await large.execute("read_deep", {"depth": depth}, None)
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["result"]) == ("succeeded", None)
    assert await db.fetchval("SELECT state FROM calls") == "succeeded"
