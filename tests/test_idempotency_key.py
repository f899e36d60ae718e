"""The Idempotency-Key header is parsed where the request arrives, but only a mutation needs
it, and only once it is authorized: access is checked (and a denial recorded) first."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from app.calls.models import IdempotencyKey
from app.errors import IdempotencyKeyInvalid, IdempotencyKeyMissing
from tests.conftest import Providers
from tests.flows import Auth, Flow, refund_args

KEY = "a-well-formed-key-0001"


@pytest.fixture
def flow(client: httpx.AsyncClient, auth: Auth) -> Flow:
    return Flow(client, auth)


@pytest.mark.parametrize("header", [KEY, f'"{KEY}"', f"  {KEY} ", f' "{KEY}"'])
def test_a_bare_or_quoted_key_parses_to_the_same_key(header: str) -> None:
    assert IdempotencyKey.parse(header).required() == KEY


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (None, IdempotencyKeyMissing),
        ("   ", IdempotencyKeyMissing),
        ("short", IdempotencyKeyInvalid),
        (f'"{KEY}', IdempotencyKeyInvalid),
        (KEY + "!", IdempotencyKeyInvalid),
    ],
)
def test_a_missing_or_malformed_key_is_refused_only_when_required(
    header: str | None, error: type[Exception]
) -> None:
    key = IdempotencyKey.parse(header)
    with pytest.raises(error):
        key.required()


async def test_a_read_ignores_a_malformed_key(flow: Flow, providers: Providers) -> None:
    response = await flow.execute("get_order", {"order_id": "ord_1"}, "short")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"


async def test_a_denied_mutation_without_a_key_is_answered_and_recorded_as_its_denial(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    response = await flow.execute("issue_refund", refund_args(customer_id="dave"), None)
    assert (response.status_code, response.json()["code"]) == (403, "identity_spoof")
    assert [tuple(r) for r in await db.fetch("SELECT decision, code, state FROM calls")] == [
        ("deny", "identity_spoof", "denied")
    ]
    assert (await providers.stats())["effects_by_path"].get("/billing/refunds", 0) == 0


async def test_two_key_lines_are_one_comma_separated_value_and_refused(
    client: httpx.AsyncClient, auth: Auth, providers: Providers
) -> None:
    """As a proxy that joins header lines would pass them on: never the first line alone."""
    for second in (KEY, "another-well-formed-key-02"):
        response = await client.post(
            "/execute",
            json={"tool": "create_ticket", "arguments": {"subject": "s", "body": "b"}},
            headers=[*auth().items(), ("Idempotency-Key", KEY), ("Idempotency-Key", second)],
        )
        assert (response.status_code, response.json()["code"]) == (400, "idempotency_key_invalid")
    assert (await providers.stats())["effects_by_path"].get("/support/tickets", 0) == 0
