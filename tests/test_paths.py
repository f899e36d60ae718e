"""A request goes only to the path shape the catalog declares, each argument inside its own
segment.

The provider routes like common web frameworks: ``DELETE /items/{id}/`` deletes the item,
``DELETE /items/{id}/tags/{tag}`` removes one tag. A tag of ``..`` must never turn the
low-impact "remove tag" call into "delete item", whether a client, a proxy or the provider
would resolve the dot segment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from aiohttp import web

from app.calls import policy
from app.catalog.loader import load
from app.catalog.models import Tool
from app.errors import InvalidArguments
from app.outbound import Outbound
from tests.conftest import running_app, serving
from tests.flows import Auth, new_key

CATALOG = """
version: "paths-1"
providers:
  shop: {base_url: "SHOP_URL/v1", timeout_s: 2}
resources:
  item:
    provider: shop
    owner: {method: GET, path: "/items/{id}/owner"}
tools:
  remove_tag:
    mutation: true
    provider: shop
    execute: {method: DELETE, path: "/items/{item_id}/tags/{tag}"}
    dry_run: {method: POST, path: "/items/{item_id}/tags/{tag}/preview"}
    impact: low
    parameters:
      type: object
      additionalProperties: false
      required: [item_id, tag]
      properties:
        item_id: {type: string, x-resource: item}
        tag: {type: string}
        note: {type: string}
"""


class Items:
    """Counts each effect and records every request line as received (raw, undecoded)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.deleted_items: list[str] = []
        self.removed_tags: list[str] = []

    def app(self) -> web.Application:
        @web.middleware
        async def record(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            self.requests.append(f"{request.method} {request.raw_path}")
            return await handler(request)

        routes = web.RouteTableDef()

        @routes.get("/v1/items/{id}/owner")
        async def owner(request: web.Request) -> web.Response:
            if request.match_info["id"] != "it_1":
                return web.json_response({"error": "no such item"}, status=404)
            return web.json_response({"tenant": "acme", "user": "alice"})

        @routes.delete("/v1/items/{id}/")
        async def delete_item(request: web.Request) -> web.Response:
            self.deleted_items.append(request.match_info["id"])
            return web.json_response({"deleted": request.match_info["id"]})

        @routes.delete("/v1/items/{id}/tags/{tag}")
        async def remove_tag(request: web.Request) -> web.Response:
            self.removed_tags.append(request.match_info["tag"])
            return web.json_response({"removed": request.match_info["tag"]})

        app = web.Application(middlewares=[record])
        app.add_routes(routes)
        return app


@pytest.fixture
async def items() -> AsyncIterator[tuple[Items, str]]:
    provider = Items()
    async with serving(provider.app()) as url:
        yield provider, url


@pytest.fixture
async def client(
    items: tuple[Items, str], env: dict[str, str], tmp_path: Path, clean: None
) -> AsyncIterator[httpx.AsyncClient]:
    (tmp_path / "paths.yaml").write_text(CATALOG.replace("SHOP_URL", items[1]))
    async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
        yield client


async def remove_tag(
    client: httpx.AsyncClient, auth: Auth, tag: str, item: str = "it_1"
) -> httpx.Response:
    return await client.post(
        "/execute",
        json={"tool": "remove_tag", "arguments": {"item_id": item, "tag": tag}},
        headers={**auth(), "Idempotency-Key": new_key()},
    )


# Values no percent-encoding confines to their segment (NUL is left to the pure tests).
ESCAPING_TAGS = ["..", ".", "", "a/../..", "../..", "a/b", "/", "a\\..\\..", "x\n", "\x7f", "\x85"]
ESCAPING_ITEMS = ["..", ".", "", "it_1/..", "it_1\\.."]


async def test_values_that_would_leave_their_segment_are_refused_before_any_request(
    client: httpx.AsyncClient, items: tuple[Items, str], auth: Auth, db: asyncpg.Connection
) -> None:
    provider, _ = items
    cases = [("it_1", tag) for tag in ESCAPING_TAGS] + [(i, "red") for i in ESCAPING_ITEMS]
    for item, tag in cases:
        response = await remove_tag(client, auth, tag, item)
        assert response.status_code == 422, (item, tag, response.text)
        assert response.json()["code"] == "invalid_arguments"
    assert provider.requests == []
    assert (provider.deleted_items, provider.removed_tags) == ([], [])
    rows = await db.fetch("SELECT decision, code FROM calls")
    assert [tuple(r) for r in rows] == [("deny", "invalid_arguments")] * len(cases)


CONFINED_TAGS = ["%2e%2e", "%2E%2E%2F..", "...", ".a", "..a", "a b", "ü", "%2f", "?x=1", "#f", ";x"]


async def test_other_values_reach_only_the_tag_route_encoded_in_their_segment(
    client: httpx.AsyncClient, items: tuple[Items, str], auth: Auth
) -> None:
    provider, _ = items
    for tag in CONFINED_TAGS:
        response = await remove_tag(client, auth, tag)
        assert response.status_code == 200, (tag, response.text)
    assert provider.deleted_items == []
    assert provider.removed_tags == CONFINED_TAGS
    deletes = [r for r in provider.requests if r.startswith("DELETE")]
    assert deletes == [f"DELETE /v1/items/it_1/tags/{quote(t, safe='')}" for t in CONFINED_TAGS]
    lookups = [r for r in provider.requests if r.startswith("GET")]
    assert lookups == ["GET /v1/items/it_1/owner"] * len(CONFINED_TAGS)


async def test_the_client_sends_a_url_exactly_as_built_with_its_query(
    items: tuple[Items, str],
) -> None:
    """No normalization on the way out: were the gateway's checks ever bypassed, a dot
    segment still reaches the provider as written instead of another route."""
    provider, url = items
    outbound = Outbound()
    await outbound.start()
    try:
        response = await outbound.request(
            "DELETE", url + "/v1/items/it_1/tags/..", timeout_s=5, params={"note": "a b&c=d"}
        )
    finally:
        await outbound.close()
    assert response.status == 200
    assert provider.requests == ["DELETE /v1/items/it_1/tags/..?note=a+b%26c%3Dd"]
    assert (provider.deleted_items, provider.removed_tags) == ([], [".."])


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Tool:
    directory = tmp_path_factory.mktemp("paths")
    (directory / "paths.yaml").write_text(CATALOG.replace("SHOP_URL", "http://127.0.0.1:9"))
    return load(directory, {}).tools["remove_tag"]


def test_path_arguments_are_the_placeholders_and_the_owner_looked_up_ids(
    tool: Tool,
) -> None:
    assert tool.path_args == {"item_id", "tag"}


@pytest.mark.parametrize("tag", [*ESCAPING_TAGS, "\x00", "a\x1fb", "\x9f", "\\"])
def test_a_tag_that_would_leave_its_segment_is_invalid(tool: Tool, tag: str) -> None:
    with pytest.raises(InvalidArguments) as caught:
        policy.prepare(tool, {"item_id": "it_1", "tag": tag})
    assert [e["path"] for e in caught.value.extra["errors"]] == ["/tag"]


@pytest.mark.parametrize("tag", [*CONFINED_TAGS, "red", "a" * 200, "%00", "\u2025", "\uff0e\uff0e"])
def test_a_tag_that_stays_in_its_segment_is_accepted(tool: Tool, tag: str) -> None:
    assert policy.prepare(tool, {"item_id": "it_1", "tag": tag}).arguments["tag"] == tag
