"""Every ``x-resource`` value is looked up or the call refused, whatever its JSON type.

A widget provider keyed by integer ids: the owner lookup and the read are counted, so a
test sees both that the owner was asked and that another tenant's record was never read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import jsonschema_rs
import pytest
from aiohttp import web

from app.calls import policy
from app.catalog.loader import load
from app.errors import InvalidArguments
from tests.conftest import running_app, serving
from tests.flows import Auth

CATALOG = """
version: "ids-1"
providers:
  shop: {base_url: "SHOP_URL", timeout_s: 2}
resources:
  widget:
    provider: shop
    owner: {method: GET, path: "/widgets/{id}/owner"}
tools:
  get_widget:
    mutation: false
    provider: shop
    execute: {method: GET, path: "/widgets/{widget_id}"}
    parameters:
      type: object
      additionalProperties: false
      required: [widget_id]
      properties:
        widget_id: {type: integer, x-resource: widget}
"""
OWNERS = {"1": {"tenant": "acme", "user": "alice"}, "2": {"tenant": "globex", "user": "carol"}}


class Shop:
    """Widgets 1 (acme) and 2 (globex), owners answered by the id's decimal text."""

    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.reads: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/widgets/{id}/owner", self.owner)
        app.router.add_get("/widgets/{id}", self.read)
        return app

    async def owner(self, request: web.Request) -> web.Response:
        widget = request.match_info["id"]
        self.lookups.append(widget)
        if widget not in OWNERS:
            return web.json_response({"error": "no such widget"}, status=404)
        return web.json_response(OWNERS[widget])

    async def read(self, request: web.Request) -> web.Response:
        widget = request.match_info["id"]
        self.reads.append(widget)
        return web.json_response({"id": int(widget), "name": f"widget {widget}"})


@pytest.fixture
async def shop(
    env: dict[str, str], tmp_path: Path, clean: None
) -> AsyncIterator[tuple[Shop, httpx.AsyncClient]]:
    shop = Shop()
    async with serving(shop.app()) as url:
        (tmp_path / "ids.yaml").write_text(CATALOG.replace("SHOP_URL", url))
        async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
            yield shop, client


async def call(client: httpx.AsyncClient, auth: Auth, path: str, widget: Any) -> httpx.Response:
    return await client.post(
        path, json={"tool": "get_widget", "arguments": {"widget_id": widget}}, headers=auth()
    )


async def test_another_tenants_integer_id_is_looked_up_refused_and_never_read(
    shop: tuple[Shop, httpx.AsyncClient], auth: Auth, db: asyncpg.Connection
) -> None:
    provider, client = shop
    for path in ("/propose", "/execute"):
        response = await call(client, auth, path, 2)
        assert response.status_code == 403, response.text
        assert response.json()["code"] == "tool_forbidden"
    assert provider.lookups == ["2", "2"]
    assert provider.reads == []
    rows = await db.fetch("SELECT decision, code, target_type, target_id FROM calls")
    assert [tuple(r) for r in rows] == [("deny", "tool_forbidden", "widget", "2")] * 2


@pytest.mark.parametrize("widget", [1, 1.0])
async def test_an_own_integer_id_is_looked_up_by_its_decimal_text_and_read(
    shop: tuple[Shop, httpx.AsyncClient], auth: Auth, widget: float
) -> None:
    """``1.0`` is the number ``1`` (RFC 8785 writes it so, and the fingerprint hashes it so):
    it is looked up, read and recorded as ``1``, never as the text ``1.0``."""
    provider, client = shop
    proposal = await call(client, auth, "/propose", widget)
    assert proposal.status_code == 200, proposal.text
    assert proposal.json()["target"] == {"type": "widget", "id": "1"}
    assert proposal.json()["arguments"] == {"widget_id": 1}
    response = await call(client, auth, "/execute", widget)
    assert response.status_code == 200, response.text
    assert response.json()["result"] == {"id": 1, "name": "widget 1"}
    assert provider.lookups == ["1", "1"]
    assert provider.reads == ["1"]


@pytest.mark.parametrize("widget", [1.5, True, "1", 2**53, -(2**53), None, [1], {"id": 1}])
async def test_an_id_that_is_not_an_exact_integer_is_refused_without_lookups(
    shop: tuple[Shop, httpx.AsyncClient], auth: Auth, db: asyncpg.Connection, widget: Any
) -> None:
    provider, client = shop
    response = await call(client, auth, "/propose", widget)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid_arguments"
    assert (provider.lookups, provider.reads) == ([], [])
    row = await db.fetchrow("SELECT decision, code FROM calls")
    assert row is not None
    assert tuple(row) == ("deny", "invalid_arguments")


@pytest.mark.parametrize("widget", [["1"], {"id": "1"}, 1.5, True, False, None, 2**53])
def test_a_value_the_schema_let_through_but_no_id_names_is_refused_not_skipped(
    tmp_path: Path, widget: Any
) -> None:
    """Defence in depth: were the schema ever to admit it, a value with no one id text is
    still a refusal, never an argument whose owner goes unchecked."""
    (tmp_path / "ids.yaml").write_text(CATALOG.replace("SHOP_URL", "http://127.0.0.1:9"))
    tool = load(tmp_path, {}).tools["get_widget"]
    anything = dataclasses.replace(tool, validator=jsonschema_rs.Draft202012Validator({}))
    with pytest.raises(InvalidArguments) as caught:
        policy.prepare(anything, {"widget_id": widget})
    assert [e["path"] for e in caught.value.extra["errors"]] == ["/widget_id"]


@pytest.mark.parametrize(("widget", "text"), [(7, "7"), (-7, "-7"), (2**53 - 1, str(2**53 - 1))])
def test_an_integer_id_is_looked_up_and_targeted_by_its_decimal_text(
    tmp_path: Path, widget: int, text: str
) -> None:
    (tmp_path / "ids.yaml").write_text(CATALOG.replace("SHOP_URL", "http://127.0.0.1:9"))
    call = policy.prepare(load(tmp_path, {}).tools["get_widget"], {"widget_id": widget})
    assert [(arg, rid) for arg, _, rid in call.resources] == [("widget_id", text)]
    assert call.target == policy.Target("widget", text)
