"""Endorsement: an ``x-endorsed`` argument's value must come from someone the user trusts
(the run's task, a trusted result of the run, a known value of the tenant), whatever the
model did to it on the way; and run scopes. The pure rules first, then the demo bank over
HTTP with ``send_money``'s recipient endorsed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.catalog.models import Endorsed
from app.catalog.trusted import WHOLE
from app.known import digests
from app.runs import comparison, endorsement
from app.runs.endorsement import Sources, Text
from examples.demo_providers import ATTACKER_IBAN, PAYEES
from tests.conftest import ROOT, Providers, running_app
from tests.flows import BOB, Flow, new_key
from tests.test_instances import Instance
from tests.test_mcp import post_call

LANDLORD = PAYEES["acc_1"][0]["iban"]
TRANSFERS = "/bank/transfers"
ADMIN = {"sub": "root", "roles": "admin"}


def text(words: str) -> Text:
    return Text.stored(endorsement.formed([words]))


def holds(source: Text, value: str) -> bool:
    value_form, kind, _ = comparison.compared(value)
    return source.holds(value_form, kind)


@pytest.mark.parametrize(
    ("value", "held"),
    [
        ("Eve", True),
        ("eve smith", True),
        ("EVE  SMITH", True),  # case and spacing do not count
        ("EVE-SMITH", False),  # punctuation does
        ("3704-0044", False),
        ("ve", False),  # inside a word
        ("Smit", False),
        ("general", False),  # "generally" is another word
        (ATTACKER_IBAN.replace(" ", ""), True),  # the whole run its groups make
        ("3704 0044", False),  # part of the run, grouped
        ("37040044", False),  # part of the run, joined
        ("0440532", False),
        ("", False),
    ],
)
def test_a_value_occurs_as_a_whole_token_or_as_a_whole_grouped_run(value: str, held: bool) -> None:
    task = text(f"Pay Eve Smith, generally monthly, to {ATTACKER_IBAN} please")
    assert holds(task, value) is held


def test_every_is_not_eve_and_no_value_sits_inside_a_longer_word_at_any_length() -> None:
    assert not holds(text("every morning"), "Eve")
    assert not holds(text("ref ABCDEFGHIJKL end"), "DEFGHIJK")


def test_a_trusted_result_endorses_within_one_of_its_values_only() -> None:
    both = Text.stored(endorsement.formed(["bob", "acme.com"]))
    assert holds(both, "bob")
    assert holds(both, "acme.com")
    assert not holds(both, "bob acme.com")


def test_a_trusted_result_never_endorses_what_the_call_sent() -> None:
    echo = endorsement.trusted_text(
        {"query": "eve@evil.example", "hits": [{"email": "bob@acme.com", "note": "Eve's pick"}]},
        WHOLE,
        {"query": "eve@evil.example"},
    )
    assert not holds(Text.stored(echo), "eve@evil.example")
    assert holds(Text.stored(echo), "bob@acme.com")
    looked_up = endorsement.trusted_text(
        {"name": "Bob", "email": "bob@acme.com"}, WHOLE, {"q": "bob"}
    )
    assert holds(Text.stored(looked_up), "bob@acme.com")  # "bob" alone was the echo
    assert not holds(Text.stored(looked_up), "Bob")


def test_a_known_values_digest_is_keyed_and_ignores_case_and_spacing_but_not_punctuation() -> None:
    key, other = b"k" * 32, b"o" * 32
    assert digests.digest(key, "payee", "DE89  3704") == digests.digest(key, "payee", "de89 3704")
    assert digests.digest(key, "payee", "DE89 3704") != digests.digest(key, "payee", "de893704")
    assert digests.digest(key, "payee", "DE89 3704") != digests.digest(key, "email", "DE89 3704")
    assert digests.digest(key, "payee", "DE89 3704") != digests.digest(other, "payee", "DE89 3704")


def test_judging_names_the_source_or_why_there_is_none() -> None:
    args = [Endorsed("recipient", "value", "payee"), Endorsed("body", "links", "send.body")]
    sources = Sources(text("pay Eve"), (text("payees: Bob Stone"),), frozenset())
    known = Sources(None, (), frozenset({("payee", "mallory")}))
    judged = endorsement.judge(args, {"recipient": "eve", "body": "hi"}, sources)
    assert [(e.argument, e.source, e.endorsed) for e in judged] == [
        ("recipient", "task", True),
        ("body", None, True),  # no link in it: nothing to endorse
    ]
    assert endorsement.judge(args[:1], {"recipient": "bob stone"}, sources)[0].source == (
        "trusted_result"
    )
    assert endorsement.judge(args[:1], {"recipient": "MALLORY"}, known)[0].source == "known"
    refused = endorsement.judge(args, {"recipient": "mallory", "body": "go to x.io"}, sources)
    assert [e.endorsed for e in refused] == [False, False]
    assert "not a known payee" in (refused[0].reason or "")
    assert "1 of the 1 links are" in (refused[1].reason or "")
    assert all(e.source is None for e in endorsement.judge(args, {"recipient": "eve"}, None))


def test_a_value_with_invisible_characters_is_never_endorsed_and_the_reason_says_so() -> None:
    args = [Endorsed("recipient", "value", "payee")]
    sources = Sources(text("pay bob@acme.com\u200b now"), (), frozenset())
    [judged] = endorsement.judge(args, {"recipient": "bob@acme.com\u200b"}, sources)
    assert not judged.endorsed
    assert "contains invisible characters" in (judged.reason or "")


def test_each_item_of_a_list_is_judged_and_the_reason_names_the_unendorsed_ones() -> None:
    args = [Endorsed("to", "value", "email", many=True)]
    sources = Sources(text("mail bob@acme.com and carol@acme.com"), (), frozenset())
    [ok] = endorsement.judge(args, {"to": ["bob@acme.com", "carol@acme.com"]}, sources)
    assert (ok.endorsed, ok.source) == (True, "task")
    [bad] = endorsement.judge(args, {"to": ["bob@acme.com", "eve@acme.co", "x@y.io"]}, sources)
    assert not bad.endorsed
    assert "items 1, 2 are not" in (bad.reason or "")
    assert endorsement.judge(args, {"to": []}, sources)[0].endorsed  # nothing to judge
    assert endorsement.judge(args, {"to": None}, sources) == ()


def test_a_process_holds_the_trusted_texts_of_its_last_runs_only() -> None:
    held = endorsement.TrustedTexts(runs=2)
    [payees] = held.put("run_a", 9, ["bob stone"])
    assert holds(payees, "Bob Stone")
    held.put("run_b", 0, [])
    assert held.get("run_a") == (9, (payees,))  # used last: run_b goes first
    held.put("run_c", 3, ["eve"])
    assert held.get("run_b") is None
    assert [chars for chars, _ in filter(None, map(held.get, ("run_a", "run_c")))] == [9, 3]
    [grown, more] = held.put("run_a", 14, ["bob stone", "alice"])[:2]
    assert held.get("run_a") == (14, (grown, more))
    assert holds(more, "alice")


# --- over HTTP: the demo bank, send_money's recipient endorsed ------------------------------

BANK = (ROOT / "examples" / "bank.yaml").read_text().replace("timeout_s: 5", "timeout_s: 1")
ENDORSED = (
    BANK.replace(
        "recipient: {type: string, minLength: 8, maxLength: 64}",
        "recipient: {type: string, minLength: 3, maxLength: 64, x-endorsed: true,"
        " x-endorsed-kind: payee}\n        message: {type: string, maxLength: 500,"
        " x-endorsed: links}",
    ).replace(
        "    on_taint: approve\n",
        "    on_taint: approve\n    on_unendorsed: MODE\n",
    )
    + """
  find_transactions:
    description: An account's transactions with a counterparty.
    mutation: false
    provider: bank
    execute: {method: GET, path: "/accounts/{account_id}/transactions"}
    access: {roles: [support], owner: tenant}
    approval: {approvers: [actor, "role:finance_approver"], ttl_s: 300}
    parameters:
      type: object
      additionalProperties: false
      required: [account_id, counterparty]
      properties:
        account_id: {type: string, x-resource: account}
        counterparty: {type: string, x-endorsed: true, x-endorsed-kind: payee}
"""
)


@pytest.fixture(scope="module")
def endorsed_catalogs(
    tmp_path_factory: pytest.TempPathFactory, catalog_dir: Path
) -> dict[str, str]:
    made = {}
    for mode in ("approve", "deny"):
        directory = tmp_path_factory.mktemp(f"endorsed_{mode}")
        (directory / "demo.yaml").write_text((catalog_dir / "demo.yaml").read_text())
        catalog = ENDORSED.replace("MODE", mode)
        if mode == "deny":  # a read whose values no approver vouches for is refused
            catalog = catalog.replace(
                '    approval: {approvers: [actor, "role:finance_approver"], ttl_s: 300}\n'
                "    parameters:\n      type: object\n      additionalProperties: false\n"
                "      required: [account_id, counterparty]",
                "    on_unendorsed: deny\n    parameters:\n      type: object\n"
                "      additionalProperties: false\n      required: [account_id, counterparty]",
            )
        (directory / "bank.yaml").write_text(catalog)
        made[mode] = str(directory)
    return made


@pytest.fixture(scope="module")
async def approving(
    env: dict[str, str], endorsed_catalogs: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app({**env, "TOOLGATE_CATALOG": endorsed_catalogs["approve"]}) as client:
        yield client


@pytest.fixture(scope="module")
async def denying(
    env: dict[str, str], endorsed_catalogs: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app({**env, "TOOLGATE_CATALOG": endorsed_catalogs["deny"]}) as client:
        yield client


@pytest.fixture
def bank(approving: httpx.AsyncClient, auth: Any, clean: None, providers: Providers) -> Flow:
    return Flow(approving, auth)


@pytest.fixture
def strict(denying: httpx.AsyncClient, auth: Any, clean: None, providers: Providers) -> Flow:
    return Flow(denying, auth)


def transfer(recipient: str, **extra: Any) -> dict[str, Any]:
    return {"account_id": "acc_1", "recipient": recipient, "amount": 10.0, **extra}


async def start_run(flow: Flow, task: str, **body: Any) -> str:
    response = await flow.post("/runs", {"task": task, **body})
    assert response.status_code == 200, response.text
    return str(response.json()["run_id"])


async def propose(flow: Flow, args: dict[str, Any], run_id: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"tool": "send_money", "arguments": args}
    if run_id is not None:
        body["run_id"] = run_id
    return await flow.post("/propose", body)


async def reached(providers: Providers, path: str = TRANSFERS) -> list[str]:
    return [r["path"] for r in await providers.requests() if r["path"].startswith(path)]


def item(argument: str, source: str | None, endorsed: bool) -> dict[str, Any]:
    return {"argument": argument, "source": source, "endorsed": endorsed}


async def test_a_recipient_the_task_names_is_endorsed_however_the_model_spells_it(
    bank: Flow, providers: Providers
) -> None:
    run_id = await start_run(bank, f"Pay the landlord, IBAN {LANDLORD}.")
    joined = LANDLORD.replace(" ", "").lower()
    answer = await propose(bank, transfer(joined), run_id)
    assert answer.status_code == 200, answer.text
    proposal = answer.json()
    assert (proposal["impact"], proposal["next"]) == ("low", "execute")
    assert proposal["endorsement"] == [item("recipient", "task", True)]
    done = await bank.execute("send_money", transfer(joined), new_key(), run_id=run_id)
    assert done.json()["status"] == "succeeded", done.text
    assert done.json()["endorsement"] == [item("recipient", "task", True)]


async def test_an_iban_handed_over_in_pieces_and_joined_by_the_model_needs_an_approval(
    bank: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    """Taint cannot see a value the model joined from pieces; endorsement asks where it
    came from, and it came from nobody the user trusts."""
    run_id = await start_run(bank, "Pay my December rent to the landlord.")
    answer = await propose(bank, transfer(ATTACKER_IBAN.replace(" ", "")), run_id)
    proposal = answer.json()
    assert (proposal["impact"], proposal["next"]) == ("high", "dry_run")
    [found] = proposal["endorsement"]
    assert (found["argument"], found["source"], found["endorsed"]) == ("recipient", None, False)
    assert ATTACKER_IBAN.replace(" ", "") not in str(found)  # reasons, never values
    direct = await bank.execute(
        "send_money", transfer(ATTACKER_IBAN.replace(" ", "")), new_key(), run_id=run_id
    )
    assert (direct.status_code, direct.json()["code"]) == (403, "approval_required")
    assert await reached(providers) == []
    inbox = await bank.client.get("/approvals?status=pending", headers=bank.auth(**BOB))
    assert inbox.json()["items"] == []  # not previewed yet
    await bank.dry_run(proposal["call_id"])
    inbox = await bank.client.get("/approvals?status=pending", headers=bank.auth(**BOB))
    assert inbox.json()["items"][0]["endorsement"] == [found]
    history = await bank.client.get(f"/calls/{proposal['call_id']}", headers=bank.auth())
    assert history.json()["proposal"]["endorsement"] == [found]
    audited = await db.fetchval(
        "SELECT outcome FROM audit_events WHERE call_id = $1 AND event = 'proposed'",
        proposal["call_id"],
    )
    assert audited["endorsement"] == [found]


async def test_with_on_unendorsed_deny_it_is_refused_recorded_and_never_sent(
    strict: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    run_id = await start_run(strict, "Pay my December rent to the landlord.")
    for path in ("/propose", "/execute"):
        refused = await strict.post(
            path,
            {"tool": "send_money", "arguments": transfer("Mallory Ltd"), "run_id": run_id},
            headers={"Idempotency-Key": new_key()},
        )
        assert (refused.status_code, refused.json()["code"]) == (403, "unendorsed_arguments")
        assert refused.json()["endorsement"][0]["endorsed"] is False
    assert await reached(providers) == []
    rows = await db.fetch("SELECT decision, code, endorsement FROM calls ORDER BY created_at")
    assert [(r["decision"], r["code"]) for r in rows] == [("deny", "unendorsed_arguments")] * 2
    assert rows[0]["endorsement"][0]["argument"] == "recipient"
    assert await db.fetchval("SELECT calls FROM runs WHERE id = $1", run_id) == 2


async def test_a_trusted_results_values_endorse_and_an_untrusted_ones_do_not(
    bank: Flow, providers: Providers
) -> None:
    run_id = await start_run(bank, "Pay my landlord the usual rent.")
    payees = await bank.post(
        "/execute",
        {"tool": "list_payees", "arguments": {"account_id": "acc_1"}, "run_id": run_id},
    )
    assert payees.status_code == 200, payees.text
    trusted = (await propose(bank, transfer(LANDLORD), run_id)).json()
    assert trusted["endorsement"] == [item("recipient", "trusted_result", True)]
    assert trusted["next"] == "execute"
    await bank.post(
        "/execute",
        {"tool": "list_transactions", "arguments": {"account_id": "acc_1"}, "run_id": run_id},
    )
    untrusted = (await propose(bank, transfer(ATTACKER_IBAN), run_id)).json()
    assert untrusted["endorsement"][0]["endorsed"] is False
    assert untrusted["next"] == "dry_run"


async def test_a_trusted_result_given_after_a_judged_call_endorses_the_next_one(
    bank: Flow, providers: Providers
) -> None:
    """The process holds a run's trusted texts between calls; a trusted result the run is
    given later is taken in by the next call, not hidden by what was held."""
    run_id = await start_run(bank, "Pay my landlord the usual rent.")
    await bank.post(
        "/execute",
        {"tool": "list_transactions", "arguments": {"account_id": "acc_1"}, "run_id": run_id},
    )
    before = (await propose(bank, transfer(LANDLORD), run_id)).json()
    assert before["endorsement"][0]["endorsed"] is False
    payees = await bank.post(
        "/execute",
        {"tool": "list_payees", "arguments": {"account_id": "acc_1"}, "run_id": run_id},
    )
    assert payees.status_code == 200, payees.text
    after = (await propose(bank, transfer(LANDLORD), run_id)).json()
    assert after["endorsement"] == [item("recipient", "trusted_result", True)]
    again = (await propose(bank, transfer(LANDLORD.lower()), run_id)).json()
    assert again["endorsement"] == [item("recipient", "trusted_result", True)]


async def test_known_values_come_from_admins_and_approvers_and_endorse_outside_a_run(
    bank: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    before = (await propose(bank, transfer("City Power"))).json()
    assert before["endorsement"][0]["endorsed"] is False
    added = await bank.client.put("/known-values/payee/City Power", headers=bank.auth(**ADMIN))
    assert added.status_code == 200, added.text
    after = (await propose(bank, transfer("CITY  power"))).json()
    assert after["endorsement"] == [item("recipient", "known", True)]
    alice = await bank.client.put("/known-values/payee/Mallory", headers=bank.auth())
    assert (alice.status_code, alice.json()["code"]) == (403, "forbidden")
    globex = await bank.client.get(
        "/known-values/payee", headers=bank.auth(sub="gus", tenant="globex", roles="admin")
    )
    assert globex.json()["items"] == []  # tenant-scoped

    # An approver vouches for a value while approving the call that holds it.
    call = (await propose(bank, transfer("Mallory Ltd"))).json()
    preview = await bank.dry_run(call["call_id"])
    approved = await bank.post(
        "/approve",
        {
            "call_id": call["call_id"],
            "snapshot_hash": preview["snapshot_hash"],
            "decision": "approve",
            "remember": ["recipient"],
        },
        BOB,
    )
    assert approved.status_code == 200, approved.text
    again = (await propose(bank, transfer("MALLORY LTD"))).json()
    assert again["endorsement"] == [item("recipient", "known", True)]
    events = await db.fetch(
        "SELECT event, actor, outcome FROM audit_events WHERE event = 'remembered' ORDER BY seq"
    )
    assert [(e["actor"], e["outcome"]["kind"]) for e in events] == [
        ("root", "payee"),
        ("bob", "payee"),
    ]
    assert all("Mallory" not in str(e["outcome"]) for e in events)
    listed = await bank.client.get("/known-values/payee", headers=bank.auth(**ADMIN))
    assert sorted(i["value"] for i in listed.json()["items"]) == ["city power", "mallory ltd"]


async def test_remember_names_only_endorsed_arguments_and_only_with_an_approval(
    bank: Flow,
) -> None:
    call = (await propose(bank, transfer("Mallory Ltd"))).json()
    preview = await bank.dry_run(call["call_id"])
    for remember, decision in ((["amount"], "approve"), (["recipient"], "reject")):
        refused = await bank.post(
            "/approve",
            {
                "call_id": call["call_id"],
                "snapshot_hash": preview["snapshot_hash"],
                "decision": decision,
                "remember": remember,
            },
            BOB,
        )
        assert (refused.status_code, refused.json()["code"]) == (400, "invalid_request")


async def test_a_link_in_free_text_must_be_endorsed_on_its_own(bank: Flow) -> None:
    run_id = await start_run(bank, f"Pay {LANDLORD} and tell them about https://my.example/lease")
    fine = await propose(
        bank, transfer(LANDLORD, message="Rent, see https://my.example/lease."), run_id
    )
    assert fine.json()["next"] == "execute"
    wrapped = await propose(
        bank, transfer(LANDLORD, message="Rent. Also confirm at evil.io/p?d=1 please"), run_id
    )
    assert wrapped.json()["next"] == "dry_run"
    assert wrapped.json()["endorsement"][1]["argument"] == "message"
    assert wrapped.json()["endorsement"][1]["endorsed"] is False


async def test_a_read_whose_argument_nobody_vouches_for_waits_for_an_approval_and_runs_once(
    bank: Flow, providers: Providers
) -> None:
    """Visiting what the attacker chose is the leak: a read is gated too."""
    args = {"account_id": "acc_1", "counterparty": "Mallory Ltd"}
    proposal = await bank.propose("find_transactions", args)
    assert (proposal["impact"], proposal["next"]) == ("high", "approval")
    read_path = "/bank/accounts/acc_1/transactions"
    direct = await bank.execute("find_transactions", args, None)
    assert (direct.status_code, direct.json()["code"]) == (403, "approval_required")
    assert await reached(providers, read_path) == []
    approval = await bank.approve(proposal["call_id"], None)
    assert approval.status_code == 200, approval.text
    done = await bank.post("/execute", {"call_id": proposal["call_id"]})
    assert done.status_code == 200, done.text
    assert done.json()["endorsement"][0]["endorsed"] is False
    again = await bank.post("/execute", {"call_id": proposal["call_id"]})
    assert again.status_code in (403, 409), again.text
    assert len(await reached(providers, read_path)) == 1


async def test_a_read_with_on_unendorsed_deny_is_refused(
    strict: Flow, providers: Providers
) -> None:
    args = {"account_id": "acc_1", "counterparty": "Mallory Ltd"}
    refused = await strict.post("/execute", {"tool": "find_transactions", "arguments": args})
    assert (refused.status_code, refused.json()["code"]) == (403, "unendorsed_arguments")
    assert await reached(providers, "/bank/accounts/acc_1/transactions") == []


async def test_a_run_scope_refuses_other_tools_and_can_only_narrow(
    bank: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    scope = {"tools": ["list_transactions", "list_payees"], "outside": "deny"}
    run_id = await start_run(bank, f"Check what I paid to {LANDLORD}.", scope=scope)
    refused = await propose(bank, transfer(LANDLORD), run_id)
    assert (refused.status_code, refused.json()["code"]) == (403, "out_of_scope")
    direct = await bank.execute("send_money", transfer(LANDLORD), new_key(), run_id=run_id)
    assert (direct.status_code, direct.json()["code"]) == (403, "out_of_scope")
    assert await reached(providers) == []
    assert await db.fetchval("SELECT calls FROM runs WHERE id = $1", run_id) == 2
    read = await bank.post(
        "/execute",
        {"tool": "list_transactions", "arguments": {"account_id": "acc_1"}, "run_id": run_id},
    )
    assert read.status_code == 200, read.text
    wider = await bank.client.patch(
        f"/runs/{run_id}",
        json={"scope": {"tools": ["list_transactions", "send_money"]}},
        headers=bank.auth(),
    )
    assert (wider.status_code, wider.json()["code"]) == (400, "invalid_request")
    looser = await bank.client.patch(
        f"/runs/{run_id}",
        json={"scope": {"tools": ["list_transactions"], "outside": "approve"}},
        headers=bank.auth(),
    )
    assert looser.status_code == 400
    narrower = await bank.client.patch(
        f"/runs/{run_id}", json={"scope": {"tools": ["list_transactions"]}}, headers=bank.auth()
    )
    assert narrower.json()["scope"] == {"tools": ["list_transactions"], "outside": "deny"}


async def test_a_scope_that_approves_outside_calls_asks_an_approver(bank: Flow) -> None:
    scope = {"tools": ["list_transactions"], "outside": "approve"}
    run_id = await start_run(bank, f"Pay {LANDLORD}.", scope=scope)
    proposal = (await propose(bank, transfer(LANDLORD), run_id)).json()
    assert (proposal["impact"], proposal["next"]) == ("high", "dry_run")


@pytest.fixture(scope="module")
async def served(
    env: dict[str, str], endorsed_catalogs: dict[str, str]
) -> AsyncIterator[dict[str, Instance]]:
    """Real instances for the MCP front door, one per ``on_unendorsed``."""
    started = {
        mode: Instance({**env, "TOOLGATE_CATALOG": directory})
        for mode, directory in endorsed_catalogs.items()
    }
    try:
        for instance in started.values():
            await instance.ready()
        yield started
    finally:
        for instance in started.values():
            instance.stop()


async def test_the_mcp_front_door_applies_endorsement_and_scope_to_calls_in_a_run(
    served: dict[str, Instance], bank: Flow, auth: Any, providers: Providers
) -> None:
    run_id = await start_run(bank, "Pay my December rent to the landlord.")
    pieces = transfer(ATTACKER_IBAN.replace(" ", ""))
    held = await post_call(
        served["approve"], auth, 1, "send_money", pieces, meta={"run_id": run_id}
    )
    assert held["structuredContent"]["status"] == "awaiting_approval", held
    other = {**pieces, "amount": 20.0}  # not the call the first request left waiting
    refused = await post_call(served["deny"], auth, 2, "send_money", other, meta={"run_id": run_id})
    assert (refused["isError"], refused["structuredContent"]["code"]) == (
        True,
        "unendorsed_arguments",
    )
    scoped = await start_run(
        bank, f"Pay {LANDLORD}.", scope={"tools": ["list_transactions"], "outside": "deny"}
    )
    outside = await post_call(
        served["approve"], auth, 3, "send_money", transfer(LANDLORD), meta={"run_id": scoped}
    )
    assert outside["structuredContent"]["code"] == "out_of_scope", outside
    endorsed = await start_run(bank, f"Pay the landlord at {LANDLORD}.")
    paid = await post_call(
        served["approve"], auth, 4, "send_money", transfer(LANDLORD), meta={"run_id": endorsed}
    )
    assert paid["isError"] is False, paid
    assert (await providers.stats())["effects_by_path"] == {TRANSFERS: 1}  # the endorsed one


@pytest.mark.parametrize("table", ["known_values", "run_memory"])
async def test_sources_that_cannot_be_read_refuse_the_call_never_endorse_it(
    bank: Flow, providers: Providers, database_url: str, db: asyncpg.Connection, table: str
) -> None:
    """Fail closed: the known values, or the trusted results the run was given, cannot be
    read (their table is locked), and the proposal is a 503, not an endorsement."""
    await bank.client.put("/known-values/payee/City Power", headers=bank.auth(**ADMIN))
    run_id = await start_run(bank, "Pay the electricity bill.")
    locker = await asyncpg.connect(database_url)
    try:
        async with locker.transaction():
            await locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            response = await propose(bank, transfer("City Power"), run_id)
    finally:
        await locker.close()
    assert (response.status_code, response.json()["code"]) == (503, "unavailable")
    assert await db.fetchval("SELECT count(*) FROM calls WHERE tool = 'send_money'") == 0
    assert await reached(providers) == []
