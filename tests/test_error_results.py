"""A provider's refusal as the model reads it (catalog ``result.error_fields``): the error
answer trimmed to the paths the catalog names, redacted, stored and replayed as it was
answered, and, in a run, remembered as an untrusted result, even of a trusted tool.

The demo billing provider refuses a refund larger than what is still refundable with
``422 {"error", "message", "refundable"}``; the demo catalog's ``issue_refund`` keeps
``error`` and ``message`` of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from tests.conftest import Providers, running_app
from tests.flows import Auth, Flow, new_key

TOO_MUCH = {"order_id": "ord_2", "amount": 50.0, "customer_id": "alice"}
"""ord_2 is 40.00 EUR: billing refuses to refund 50.00 of it."""
MESSAGE = "only 40.00 EUR of ord_2 is refundable"


async def refused(flow: Flow, tool: str, run_id: str | None = None) -> dict[str, Any]:
    """The answer to an over-refund, previewed first as the tool requires."""
    extra: dict[str, Any] = {"run_id": run_id} if run_id else {}
    proposal = await flow.post("/propose", {"tool": tool, "arguments": TOO_MUCH, **extra})
    assert proposal.status_code == 200, proposal.text
    await flow.dry_run(proposal.json()["call_id"])
    answer = await flow.execute(tool, TOO_MUCH, new_key(), **extra)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["provider_status"]) == ("failed", 422)
    return answer.json()  # type: ignore[no-any-return]


async def start_run(flow: Flow) -> str:
    response = await flow.post("/runs", {"task": "help a customer", "limits": {}})
    assert response.status_code == 200, response.text
    return response.json()["run_id"]  # type: ignore[no-any-return]


async def test_a_refusal_shows_the_model_its_error_fields_and_nothing_else(
    flow: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    key = new_key()
    proposal = await flow.propose("issue_refund", TOO_MUCH)
    await flow.dry_run(proposal["call_id"])
    first = await flow.execute("issue_refund", TOO_MUCH, key)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert (answer["status"], answer["provider_status"]) == ("failed", 422)
    # The provider also answered "refundable", which error_fields does not name.
    assert answer["result"] == {"error": "exceeds_refundable", "message": MESSAGE}
    assert answer["trust"] == "untrusted"
    stored = await db.fetchval(
        "SELECT response FROM executions WHERE call_id = $1", answer["call_id"]
    )
    assert stored["result"] == answer["result"]
    again = await flow.execute("issue_refund", TOO_MUCH, key)
    assert again.json() == {**answer, "replayed": True}
    refunds = [r for r in await providers.requests() if r["path"] == "/billing/refunds"]
    assert len(refunds) == 1


async def test_a_refusal_read_in_a_run_taints_an_argument_copied_from_it(flow: Flow) -> None:
    run_id = await start_run(flow)
    answer = await refused(flow, "issue_refund", run_id)
    assert answer["result"]["message"] == MESSAGE
    ticket = {"subject": "Refund refused", "body": MESSAGE}
    copied = await flow.post(
        "/propose", {"tool": "create_ticket", "arguments": ticket, "run_id": run_id}
    )
    assert (copied.status_code, copied.json()["code"]) == (403, "tainted_arguments"), copied.text
    taint = [{"argument": "body", "source_call_id": answer["call_id"]}]
    assert copied.json()["taint"] == taint
    written = {"subject": "Refund refused", "body": "The customer asked for too much."}
    own = await flow.post(
        "/propose", {"tool": "create_ticket", "arguments": written, "run_id": run_id}
    )
    assert (own.status_code, own.json()["decision"]) == (200, "allow"), own.text


NOT_POSITIVE = "amount must be a positive number"
"""What billing's refund preview answers (400) to an amount that is not above zero."""


@pytest.fixture(scope="module")
def trusted_catalog(tmp_path_factory: pytest.TempPathFactory, catalog_dir: Path) -> Path:
    """The demo catalog plus ``quote_refund``: a read of billing's refund preview whose
    results are marked trusted (only a read's can be), and which leaves the amount to billing
    to refuse, keeping ``detail`` of a refusal and ``error`` redacted."""
    directory = tmp_path_factory.mktemp("trusted_quote")
    demo = (catalog_dir / "demo.yaml").read_text()
    (directory / "demo.yaml").write_text(demo)
    tool = {
        "mutation": False,
        "provider": "billing",
        "execute": {"method": "POST", "path": "/refunds/preview"},
        "access": {"roles": ["support"]},
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["order_id", "amount"],
            "properties": {
                "order_id": {"type": "string", "x-resource": "order"},
                "amount": {"type": "number"},
            },
        },
        "result": {
            "fields": ["order_id", "amount", "refundable"],
            "error_fields": ["error", "detail"],
            "redact": ["error"],
            "trusted": True,
        },
    }
    (directory / "trusted.yaml").write_text(yaml.safe_dump({"tools": {"quote_refund": tool}}))
    return directory


@pytest.fixture
async def trusting(
    env: dict[str, str], trusted_catalog: Path, clean: None, providers: Providers
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app({**env, "TOOLGATE_CATALOG": str(trusted_catalog)}) as client:
        yield client


async def test_redact_applies_to_a_refusal_and_a_trusted_tools_refusal_endorses_nothing(
    trusting: httpx.AsyncClient, auth: Auth
) -> None:
    """``trusted`` vouches for the tool's data; a provider's error text may quote anyone."""
    flow = Flow(trusting, auth)
    run_id = await start_run(flow)
    quote = {"order_id": "ord_2", "amount": 0}
    answer = (await flow.execute("quote_refund", quote, None, run_id=run_id)).json()
    assert (answer["status"], answer["provider_status"]) == ("failed", 400), answer
    assert answer["result"] == {"error": "[redacted]", "detail": NOT_POSITIVE}
    ticket = {"subject": "Refund refused", "body": NOT_POSITIVE}
    copied = await flow.post(
        "/propose", {"tool": "create_ticket", "arguments": ticket, "run_id": run_id}
    )
    assert (copied.status_code, copied.json()["code"]) == (403, "tainted_arguments"), copied.text
