"""GET /catalog: only usable tools, annotations stripped, each ecosystem's shape."""

from __future__ import annotations

import httpx
import pytest

from tests.flows import Auth


@pytest.mark.parametrize("fmt", ["raw", "openai", "anthropic", "mcp"])
async def test_annotations_never_leave_in_any_format(
    client: httpx.AsyncClient, auth: Auth, fmt: str
) -> None:
    response = await client.get(f"/catalog?format={fmt}", headers=auth())
    assert response.status_code == 200
    assert "x-identity" not in response.text
    assert "x-resource" not in response.text
    assert "x-sensitive" not in response.text


async def test_only_tools_the_principal_may_use_are_listed(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    support = await client.get("/catalog", headers=auth())
    customer = await client.get("/catalog", headers=auth("dave", roles="customer"))
    support_tools = {t["name"] for t in support.json()["tools"]}
    customer_tools = {t["name"] for t in customer.json()["tools"]}
    assert "issue_refund" in support_tools
    assert "issue_refund" not in customer_tools
    assert "get_customer" in customer_tools


async def test_each_format_has_its_ecosystems_shape(client: httpx.AsyncClient, auth: Auth) -> None:
    def refund(fmt: str) -> dict[str, object]:
        tools = client_tools[fmt]
        return next(t for t in tools if "issue_refund" in str(t.get("name", t.get("function"))))

    client_tools = {
        fmt: (await client.get(f"/catalog?format={fmt}", headers=auth())).json()["tools"]
        for fmt in ("raw", "openai", "anthropic", "mcp")
    }
    openai = refund("openai")
    assert openai["type"] == "function"
    assert openai["function"]["parameters"]["required"] == [  # type: ignore[index]
        "order_id",
        "amount",
        "customer_id",
    ]
    assert set(refund("anthropic")) == {"name", "description", "input_schema"}
    mcp = refund("mcp")
    assert mcp["inputSchema"]["type"] == "object"  # type: ignore[index]
    assert mcp["annotations"]["readOnlyHint"] is False  # type: ignore[index]
    assert refund("raw")["mutation"] is True


async def test_an_unknown_format_is_an_invalid_request(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    response = await client.get("/catalog?format=yaml", headers=auth())
    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")
