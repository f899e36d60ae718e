"""``x-egress: public``: only URLs every HTTP client reads alike, and only public addresses.

The provider that later fetches the URL parses it with its own parser (urllib3, a WHATWG
parser, libc's ``inet_aton``), so anything two parsers could read differently is refused.
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

from app.auth.principal import Principal
from app.calls import policy
from app.calls.policy import Facts, egress_host, is_public
from app.catalog.loader import load
from app.catalog.models import Tool
from app.errors import ToolForbidden
from tests.conftest import running_app, serving
from tests.flows import Auth

ACCEPTED = [
    ("https://hooks.example/x", "hooks.example"),
    ("http://Hooks.Example:8080/a?b=c#d", "hooks.example"),
    ("HTTPS://example.com", "example.com"),
    ("http://example.com:1/", "example.com"),
    ("http://example.com:65535/", "example.com"),
    ("http://xn--bcher-kva.example/", "xn--bcher-kva.example"),
    ("http://a-b.c0.example/", "a-b.c0.example"),
    ("http://123.example.com/", "123.example.com"),
    ("http://93.184.216.34/", "93.184.216.34"),
    ("http://[2606:4700::1]:443/x", "2606:4700::1"),
    ("http://[::FFFF:127.0.0.1]/", "::ffff:7f00:1"),  # accepted here, refused by its address
    ("http://example.com/a@b", "example.com"),
    ("http://example.com?@127.0.0.1/", "example.com"),
    ("http://example.com#@127.0.0.1/", "example.com"),
    ("http://example.com/%2e%2e/%40", "example.com"),
]

REFUSED = [
    # a backslash, which WHATWG parsers and urllib3 read as '/' but urlsplit does not
    "http://evil.com\\@127.0.0.1/",
    "http://127.0.0.1\\@evil.com/",
    "http://evil.com\\.127.0.0.1/",
    "http://example.com/a\\b",
    # userinfo
    "http://user@example.com/",
    "http://user:pw@example.com/",
    "http://@example.com/",
    "http://evil.com:80@127.0.0.1/",
    # whitespace and control characters, which some parsers strip
    "http://exa mple.com/",
    "http://example.com/a b",
    " http://example.com/",
    "http://example.com/\t",
    "http://exam\tple.com/",
    "http://example.com/\n",
    "http://example.com\x00.evil/",
    "http://example.com/\x7f",
    # not ASCII
    "http://ex\u00e4mple.com/",
    "http://example.com/\u00e4",
    "http://example\u3002com/",
    # not an absolute http(s) URL
    "ftp://example.com/",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "//example.com/",
    "example.com",
    "http:/example.com",
    "http:example.com",
    "http:///example.com",
    "https://",
    "http://:80/",
    # ports
    "http://example.com:99999/",
    "http://example.com:0/",
    "http://example.com:/",
    "http://example.com:8a/",
    "http://example.com:123456/",
    "http://example.com:-1/",
    # numbers other parsers read as IPv4 addresses
    "http://127.1/",
    "http://127.0.1/",
    "http://0x7f.0.0.1/",
    "http://0x7f000001/",
    "http://2130706433/",
    "http://0177.0.0.1/",
    "http://127.0.0.01/",
    "http://127.0.0.1./",
    "http://1.2.3.4.5/",
    "http://256.0.0.1/",
    "http://example.0x10/",
    "http://example.123/",
    "http://0x/",
    # percent-encoded hosts, which WHATWG parsers decode
    "http://%31%32%37.0.0.1/",
    "http://exa%6dple.com/",
    # malformed DNS names
    "http://example.com./",
    "http://-example.com/",
    "http://example-.com/",
    "http://exa_mple.com/",
    "http://a..b/",
    "http://.example.com/",
    "http://" + "a" * 64 + ".com/",
    "http://" + ".".join(["a" * 60] * 5) + ".com/",
    # malformed IPv6 literals
    "http://[::1%25eth0]/",
    "http://[fe80::1%eth0]/",
    "http://[127.0.0.1]/",
    "http://[::1/",
    "http://::1/",
    "http://[::1]x/",
    "http://[::1]:/",
    "http://[v1.x]/",
]


@pytest.mark.parametrize(("url", "host"), ACCEPTED)
def test_a_strictly_valid_url_gives_its_host(url: str, host: str) -> None:
    assert egress_host(url) == host


@pytest.mark.parametrize("url", REFUSED)
def test_a_url_parsers_could_read_differently_is_refused(url: str) -> None:
    assert egress_host(url) is None


@pytest.mark.parametrize("value", [None, 42, 1.5, True, ["http://example.com/"], {"u": "x"}])
def test_a_value_that_is_not_a_string_is_not_a_url(value: Any) -> None:
    assert egress_host(value) is None


PUBLIC = [
    "93.184.216.34",
    "8.8.8.8",
    "2606:4700::1",
    "2a00:1450:4001:81b::200e",
    "::ffff:93.184.216.34",  # IPv4-mapped
    "64:ff9b::5db8:d822",  # NAT64 of 93.184.216.34
    "2002:5db8:d822::1",  # 6to4 of 93.184.216.34
    "2001:0:5db8:d822::a2f7:f7dd",  # Teredo: server 93.184.216.34, client 93.8.8.34
]

NOT_PUBLIC = [
    "127.0.0.1",
    "10.1.2.3",
    "172.16.5.5",
    "192.168.0.1",
    "169.254.169.254",
    "100.64.0.1",
    "0.0.0.0",
    "255.255.255.255",
    "224.0.0.1",
    "198.18.0.1",
    "192.0.0.8",  # IETF protocol assignments (192.0.0.0/24): not globally reachable, though
    "192.0.0.100",  # Python before 3.11.10 / 3.12.4 calls all but 192.0.0.0/29 global
    "::ffff:192.0.0.100",
    "64:ff9b::c000:64",  # NAT64 of 192.0.0.100
    "::",
    "::1",
    "fe80::1",
    "fe80::1%eth0",
    "fc00::1",
    "fd12:3456::1",
    "ff02::1",
    "ff0e::1",
    "fec0::1",  # site-local
    "feff::1",
    "::7f00:1",  # IPv4-compatible 127.0.0.1
    "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b:1::5db8:d822",  # local-use NAT64
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001:0:5db8:d822::80ff:fffe",  # Teredo with client 127.0.0.1
    "2001:0:a00:1::a2f7:f7dd",  # Teredo with server 10.0.0.1
    "2001:db8::1",
    "3fff::1",  # documentation, since 2024
    "5f00::1",  # segment routing SIDs
    "not an address",
    "",
]


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_public(address: str) -> None:
    assert is_public(address)


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_other_addresses_are_not_public(address: str) -> None:
    assert not is_public(address)


CATALOG = """
version: "egress-1"
providers:
  hooks: {base_url: "HOOKS_URL", timeout_s: 2}
tools:
  ping_hook:
    mutation: false
    provider: hooks
    execute: {method: POST, path: /hooks/ping}
    parameters:
      type: object
      additionalProperties: false
      required: [url]
      properties:
        url: {type: string, x-egress: public}
"""
ALICE = Principal("alice", "acme", frozenset({"support"}))


def ping_hook(directory: Path) -> Tool:
    (directory / "egress.yaml").write_text(CATALOG.replace("HOOKS_URL", "http://127.0.0.1:9"))
    return load(directory, {}).tools["ping_hook"]


@pytest.mark.parametrize("value", [42, None, ["https://example.com/"], {"url": "x"}, True])
def test_a_non_string_egress_value_is_refused_never_skipped(tmp_path: Path, value: Any) -> None:
    """Defence in depth: were the schema ever to admit it, the value is still checked."""
    tool = dataclasses.replace(
        ping_hook(tmp_path), validator=jsonschema_rs.Draft202012Validator({})
    )
    call = policy.prepare(tool, {"url": value})
    assert call.egress == (("url", value),)
    with pytest.raises(ToolForbidden):
        policy.decide(ALICE, call, Facts({}, {"url": ("93.184.216.34",)}))


class Hooks:
    def __init__(self) -> None:
        self.pings: list[Any] = []

    def app(self) -> web.Application:
        async def ping(request: web.Request) -> web.Response:
            self.pings.append((await request.json())["url"])
            return web.json_response({"pinged": True})

        app = web.Application()
        app.router.add_post("/hooks/ping", ping)
        return app


@pytest.fixture
async def hooks(
    env: dict[str, str], tmp_path: Path, clean: None
) -> AsyncIterator[tuple[Hooks, httpx.AsyncClient]]:
    provider = Hooks()
    async with serving(provider.app()) as url:
        (tmp_path / "egress.yaml").write_text(CATALOG.replace("HOOKS_URL", url))
        async with running_app({**env, "TOOLGATE_CATALOG": str(tmp_path)}) as client:
            yield provider, client


async def test_backslash_numeric_and_non_string_urls_are_refused_recorded_and_never_sent(
    hooks: tuple[Hooks, httpx.AsyncClient], auth: Auth, db: asyncpg.Connection
) -> None:
    provider, client = hooks
    cases: list[tuple[Any, int, str]] = [
        ("http://evil.com\\@127.0.0.1/", 403, "tool_forbidden"),
        ("http://127.1/", 403, "tool_forbidden"),
        ("http://192.0.0.100/", 403, "tool_forbidden"),
        ("http://user@93.184.216.34/", 403, "tool_forbidden"),
        ("http://[64:ff9b::a9fe:a9fe]/latest/meta-data", 403, "tool_forbidden"),
        (42, 422, "invalid_arguments"),
        (["http://93.184.216.34/"], 422, "invalid_arguments"),
    ]
    for path in ("/propose", "/execute"):
        for value, status, code in cases:
            response = await client.post(
                path, json={"tool": "ping_hook", "arguments": {"url": value}}, headers=auth()
            )
            assert (response.status_code, response.json()["code"]) == (status, code), value
    assert provider.pings == []
    rows = await db.fetch("SELECT decision, code FROM calls ORDER BY created_at")
    assert [tuple(r) for r in rows] == [("deny", code) for _, _, code in cases] * 2
    denied = await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'denied'")
    assert denied == 2 * len(cases)


async def test_a_public_url_is_allowed_and_forwarded(
    hooks: tuple[Hooks, httpx.AsyncClient], auth: Auth
) -> None:
    provider, client = hooks
    url = "http://93.184.216.34/hook?x=1"
    response = await client.post(
        "/execute", json={"tool": "ping_hook", "arguments": {"url": url}}, headers=auth()
    )
    assert response.status_code == 200, response.text
    assert provider.pings == [url]
