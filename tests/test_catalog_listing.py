"""GET /catalog: only usable tools, annotations stripped, each ecosystem's shape."""

from __future__ import annotations

import re
from typing import Any

import httpx
import jsonschema
import pytest

from tests.flows import Auth, Flow, refund_args


@pytest.mark.parametrize("fmt", ["raw", "openai", "openai-responses", "anthropic", "mcp"])
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


FORMATS = ["raw", "openai", "openai-responses", "anthropic", "mcp"]
RESPONSES_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
STRICT_KEYWORDS = {
    "type",
    "description",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$defs",
    "$ref",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
}


async def tools_of(
    client: httpx.AsyncClient, auth: Auth, query: str, status: int = 200
) -> list[dict[str, Any]]:
    response = await client.get(f"/catalog?{query}", headers=auth())
    assert response.status_code == status, response.text
    return response.json()["tools"]  # type: ignore[no-any-return]


def schema_of(tool: dict[str, Any]) -> dict[str, Any]:
    for key in ("parameters", "input_schema", "inputSchema"):
        if key in tool:
            return tool[key]  # type: ignore[no-any-return]
    return tool["function"]["parameters"]  # type: ignore[no-any-return]


def named(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(t for t in tools if t.get("name", t.get("function", {}).get("name")) == name)


def assert_strict(schema: dict[str, Any], where: str = "") -> None:
    """What OpenAI's strict mode demands of a function's parameters: at every object level
    all properties required and no others allowed; only keywords it knows."""
    assert set(schema) <= STRICT_KEYWORDS, (where, set(schema) - STRICT_KEYWORDS)
    if "properties" in schema or schema.get("type") == "object":
        assert schema["additionalProperties"] is False, where
        assert schema["required"] == list(schema["properties"]), where
        for name, prop in schema["properties"].items():
            assert_strict(prop, f"{where}/{name}")
    for branch in schema.get("anyOf", []):
        assert_strict(branch, where)
    if isinstance(schema.get("items"), dict):
        assert_strict(schema["items"], f"{where}/items")


@pytest.mark.parametrize("fmt", FORMATS)
async def test_identity_arguments_are_never_shown_to_the_model(
    client: httpx.AsyncClient, auth: Auth, fmt: str
) -> None:
    tools = await tools_of(client, auth, f"format={fmt}")
    refund = schema_of(named(tools, "issue_refund"))
    assert "customer_id" not in refund["properties"]
    assert refund["required"] == ["order_id", "amount"]
    assert "currency" in refund["properties"]


@pytest.mark.parametrize("strict", ["false", "true"])
async def test_responses_tools_are_flat_function_tools(
    client: httpx.AsyncClient, auth: Auth, strict: str
) -> None:
    tools = await tools_of(client, auth, f"format=openai-responses&strict={strict}")
    assert tools
    for tool in tools:
        assert set(tool) == RESPONSES_TOOL_KEYS
        assert tool["type"] == "function"
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool["name"])
        assert isinstance(tool["description"], str)
        assert tool["strict"] is (strict == "true")
        assert tool["parameters"]["type"] == "object"
        if tool["strict"]:
            assert_strict(tool["parameters"], tool["name"])


@pytest.mark.parametrize("fmt", ["openai", "openai-responses"])
async def test_strict_schemas_require_every_property_and_let_optional_ones_be_null(
    client: httpx.AsyncClient, auth: Auth, fmt: str
) -> None:
    tools = await tools_of(client, auth, f"format={fmt}&strict=true")
    for tool in tools:
        assert_strict(schema_of(tool), str(tool))
    if fmt == "openai":
        assert all(t["function"]["strict"] is True for t in tools)
    refund = schema_of(named(tools, "issue_refund"))
    assert refund["required"] == ["order_id", "amount", "currency", "notify_url", "note"]
    assert refund["properties"]["amount"]["type"] == "number"
    assert refund["properties"]["currency"] == {
        "type": ["string", "null"],
        "enum": ["EUR", "USD", None],
    }
    assert refund["properties"]["note"] == {"type": ["string", "null"]}
    assert refund["properties"]["notify_url"] == {"type": ["string", "null"]}
    sent = {"order_id": "ord_1", "amount": 150, "currency": None, "notify_url": None, "note": None}
    jsonschema.validate(sent, refund)


@pytest.mark.parametrize("fmt", ["raw", "anthropic", "mcp"])
async def test_strict_is_refused_for_formats_that_have_no_strict_mode(
    client: httpx.AsyncClient, auth: Auth, fmt: str
) -> None:
    response = await client.get(f"/catalog?format={fmt}&strict=true", headers=auth())
    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")


async def test_mcp_tools_carry_a_title_and_hints_from_their_impact(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    tools = await tools_of(client, auth, "format=mcp")
    hints = {t["name"]: (t["title"], t["annotations"]) for t in tools}
    read = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True}
    assert hints["get_order"] == ("Get order", read)
    may_be_high = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False}
    assert hints["issue_refund"] == ("Issue refund", may_be_high)
    low = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False}
    assert hints["create_ticket"] == ("Create ticket", low)


async def test_a_model_that_follows_the_strict_schema_is_understood(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    """The strict-mode model omits the hidden customer_id and sends null for what it leaves
    out: the same call, the same fingerprint, as the fully written one."""
    flow = Flow(client, auth)
    sent = {"order_id": "ord_1", "amount": 150, "currency": None, "notify_url": None, "note": None}
    from_model = await flow.propose("issue_refund", sent)
    written = await flow.propose("issue_refund", refund_args(150, currency="EUR"))
    assert from_model["arguments"] == {
        "order_id": "ord_1",
        "amount": 150,
        "customer_id": "alice",
        "currency": "EUR",
    }
    assert from_model["fingerprint"] == written["fingerprint"]
    spoof = await flow.post(
        "/propose", {"tool": "issue_refund", "arguments": refund_args(customer_id="bob")}
    )
    assert (spoof.status_code, spoof.json()["code"]) == (403, "identity_spoof")
    required_null = await flow.post(
        "/propose", {"tool": "issue_refund", "arguments": {**sent, "amount": None}}
    )
    assert (required_null.status_code, required_null.json()["code"]) == (422, "invalid_arguments")
