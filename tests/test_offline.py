"""``toolgate test``: a catalog's decisions tested offline. The shipped demo test file
passes; failures and malformed files are told with their file:line; and the same cases,
decided by a live toolgate with the demo providers and decided offline, agree on every
code the pure decision can produce."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple
from xml.etree import ElementTree

import httpx
import pytest
import yaml

from app.calls import offline
from app.cli import main
from examples.demo_providers import ACCOUNTS, ATTACKER_IBAN, CUSTOMERS, ORDERS, PAYEES, SERVICES
from tests.conftest import ROOT, Providers, running_app
from tests.flows import Auth
from tests.test_endorsement import ENDORSED

DEMO_TESTS = ROOT / "catalog" / "tests"


def toolgate_test(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["test", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def write(directory: Path, document: dict[str, Any] | str) -> Path:
    path = directory / "policy_test.yaml"
    text = document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False)
    path.write_text(text)
    return path


def demo_file(**cases: Any) -> dict[str, Any]:
    return {
        "catalog": str(ROOT / "catalog"),
        "principals": {"alice": {"tenant": "acme", "roles": ["support"]}},
        "owners": {"order": {"ord_1": {"tenant": "acme", "user": "dave"}}},
        "cases": [{"name": name, "as": "alice", **case} for name, case in cases.items()],
    }


def test_the_demo_catalog_ships_with_tests_that_pass(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    status, out, err = toolgate_test(capsys, str(DEMO_TESTS), "--junit", str(junit))
    assert (status, err) == (0, ""), out
    cases = ElementTree.parse(junit).getroot()
    assert cases.get("failures") == "0"
    assert int(cases.get("tests") or 0) >= 15
    assert out.strip().endswith(f"{cases.get('tests')} passed, 0 failed")


def test_a_failing_case_says_expected_against_got_and_where(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    read = {"propose": {"tool": "get_order", "arguments": {"order_id": "ord_1"}}}
    path = write(
        tmp_path,
        demo_file(
            right={**read, "expect": {"decision": "allow", "next": "execute"}},
            wrong={**read, "expect": {"decision": "deny", "code": "tool_forbidden"}},
        ),
    )
    junit = tmp_path / "junit.xml"
    status, out, _ = toolgate_test(capsys, str(path), "--junit", str(junit))
    assert status == 1
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "wrong" in text)
    assert (
        f"{path}:{line}: wrong: decision: expected 'deny', got 'allow', "
        "code: expected 'tool_forbidden', got None"
    ) in out
    assert "right" not in out
    assert out.strip().endswith("1 passed, 1 failed")
    [failure] = ElementTree.parse(junit).getroot().iter("failure")
    assert "expected 'deny'" in (failure.get("message") or "")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"cases": [{"name": "x", "as": "alice", "propose": {"tool": "t"}, "expct": {}}]},
            "cases.0.expct: Extra inputs are not permitted",
        ),
        (
            {"cases": [{"name": "x", "as": "mallory", "propose": {"tool": "t"}, "expect": {}}]},
            "cases.0.as: no principal named 'mallory'",
        ),
        ({"catalog": "nowhere"}, "nowhere"),
        (
            {"principals": {"alice": {"roles": ["support"]}}},
            "principals.alice.tenant: Field required",
        ),
    ],
)
def test_a_malformed_file_is_an_error_with_its_place(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: dict[str, Any], message: str
) -> None:
    case = {"propose": {"tool": "get_order", "arguments": {"order_id": "ord_1"}}, "expect": {}}
    path = write(tmp_path, {**demo_file(ok=case), **edit})
    status, _, err = toolgate_test(capsys, str(path))
    assert status == 1
    assert message in err, err
    assert err.startswith(str(path) + ":") or message == "nowhere", err
    assert "Traceback" not in err


def test_yaml_that_does_not_parse_names_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "catalog: ..\ncases:\n  - {name: x, as: [\n")
    status, _, err = toolgate_test(capsys, str(path))
    assert status == 1
    assert err.startswith(f"{path}:"), err


def test_no_test_files_is_a_failure_not_a_pass(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = toolgate_test(capsys, str(tmp_path))
    assert status == 1
    assert "no *_test.yaml" in err


# --- offline and live agree ---------------------------------------------------------------

LANDLORD = PAYEES["acc_1"][0]
ADMIN = {"sub": "root", "roles": "admin"}
PRINCIPALS = {
    "alice": {"tenant": "acme", "roles": ["support"]},
    "dave": {"tenant": "acme", "roles": ["customer"]},
    "gus": {"tenant": "globex", "roles": ["support"]},
}
KNOWN = {"acme": {"payee": ["City Power"]}}


class Scenario(NamedTuple):
    name: str
    who: str
    tool: str
    arguments: dict[str, Any]
    task: str | None = None
    reads: tuple[tuple[str, dict[str, Any]], ...] = ()
    """Calls made in the run before the proposal (their results are what it was given)."""
    scope: dict[str, Any] | None = None
    in_run: bool = False


def pay(recipient: str, **extra: Any) -> dict[str, Any]:
    return {"account_id": "acc_1", "recipient": recipient, "amount": 10.0, **extra}


TRANSACTIONS = ("list_transactions", {"account_id": "acc_1"})
SAVED_PAYEES = ("list_payees", {"account_id": "acc_1"})
SCENARIOS = [
    Scenario("a read", "alice", "get_order", {"order_id": "ord_1"}),
    Scenario("another tenant's order", "gus", "get_order", {"order_id": "ord_1"}),
    Scenario("no such order", "alice", "get_order", {"order_id": "ord_404"}),
    Scenario("a malformed id", "alice", "get_order", {"order_id": "ord 1"}),
    Scenario("no such tool", "alice", "drop_tables", {}),
    Scenario("a role it lacks", "dave", "issue_refund", {"order_id": "ord_1", "amount": 5.0}),
    Scenario(
        "a spoofed identity",
        "alice",
        "issue_refund",
        {"order_id": "ord_1", "amount": 5.0, "customer_id": "dave"},
    ),
    Scenario("a large refund", "alice", "issue_refund", {"order_id": "ord_1", "amount": 150.0}),
    Scenario(
        "a private address",
        "alice",
        "issue_refund",
        {"order_id": "ord_1", "amount": 5.0, "notify_url": "http://10.0.0.7/hook"},
    ),
    Scenario(
        "the attacker's IBAN read in a transaction note",
        "alice",
        "send_money",
        pay(ATTACKER_IBAN),
        task="Pay my December rent to the landlord.",
        reads=(TRANSACTIONS,),
    ),
    Scenario(
        "the recipient the task names",
        "alice",
        "send_money",
        pay(LANDLORD["iban"].replace(" ", "").lower()),
        task=f"Pay 950 to the landlord, IBAN {LANDLORD['iban']}.",
        reads=(TRANSACTIONS,),
    ),
    Scenario(
        "a saved payee",
        "alice",
        "send_money",
        pay("Landlord GmbH"),
        task="Pay the rent.",
        reads=(SAVED_PAYEES,),
    ),
    Scenario("a known payee outside a run", "alice", "send_money", pay("city-power")),
    Scenario(
        "a recipient nobody vouched for",
        "alice",
        "send_money",
        pay("Mallory Ltd"),
        task="Pay the electricity bill.",
        in_run=True,
    ),
    Scenario(
        "a link nobody vouched for",
        "alice",
        "send_money",
        pay("City Power", message="invoice at https://evil.example/pay"),
        in_run=True,
        task="Pay the electricity bill.",
    ),
    Scenario(
        "a tool outside the run's scope",
        "alice",
        "send_money",
        pay("City Power"),
        task="What did I spend?",
        scope={"tools": ["list_transactions"]},
    ),
]
CODES = {
    "invalid_arguments",
    "unknown_tool",
    "identity_spoof",
    "tool_forbidden",
    "tainted_arguments",
    "unendorsed_arguments",
    "out_of_scope",
}
"""Every refusal the pure decision can produce."""


@pytest.fixture
async def live(
    env: dict[str, str], tmp_path: Path, catalog_dir: Path, clean: None, providers: Providers
) -> AsyncIterator[tuple[httpx.AsyncClient, Path]]:
    """A toolgate whose catalog is the demo's and a bank that refuses tainted and
    unendorsed transfers; yields a client of it and its catalog directory."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "demo.yaml").write_text((catalog_dir / "demo.yaml").read_text())
    bank = ENDORSED.replace("MODE", "deny").replace("on_taint: approve", "on_taint: deny")
    (catalog / "bank.yaml").write_text(bank)
    async with running_app({**env, "TOOLGATE_CATALOG": str(catalog)}) as client:
        yield client, catalog


def seen(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """What the live service decided, in ``toolgate test``'s terms."""
    if status != 200:
        return {
            "decision": "deny",
            "code": body["code"],
            "next": None,
            "impact": None,
            "taint": sorted({t["argument"] for t in body.get("taint", [])}),
            "endorsement": {
                e["argument"]: e["source"] or "none" for e in body.get("endorsement", [])
            },
        }
    return {
        "decision": "allow",
        "code": None,
        "next": body["next"],
        "impact": body["impact"],
        "taint": sorted({t["argument"] for t in body.get("taint") or []}),
        "endorsement": {
            e["argument"]: e["source"] or "none" for e in body.get("endorsement") or []
        },
    }


async def decided_live(
    client: httpx.AsyncClient, auth: Auth, scenario: Scenario
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The live decision, and the run the case file states (its task, scope and results)."""
    who = PRINCIPALS[scenario.who]
    headers = auth(sub=scenario.who, tenant=who["tenant"], roles=",".join(who["roles"]))
    body: dict[str, Any] = {"tool": scenario.tool, "arguments": scenario.arguments}
    run: dict[str, Any] | None = None
    if scenario.task is not None or scenario.reads or scenario.scope or scenario.in_run:
        started = {"task": scenario.task, **({"scope": scenario.scope} if scenario.scope else {})}
        answer = await client.post("/runs", json=started, headers=headers)
        assert answer.status_code == 200, answer.text
        body["run_id"] = answer.json()["run_id"]
        run = {"task": scenario.task, "results": []}
        if scenario.scope:
            run["scope"] = scenario.scope
        for tool, arguments in scenario.reads:
            read = {"tool": tool, "arguments": arguments, "run_id": body["run_id"]}
            done = await client.post("/execute", json=read, headers=headers)
            assert done.status_code == 200, done.text
            run["results"].append(
                {"tool": tool, "arguments": arguments, "result": done.json()["result"]}
            )
    proposed = await client.post("/propose", json=body, headers=headers)
    return seen(proposed.status_code, proposed.json()), run


async def test_offline_decisions_agree_with_a_live_toolgate_on_every_code(
    live: tuple[httpx.AsyncClient, Path],
    auth: Auth,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, catalog = live
    for value in KNOWN["acme"]["payee"]:
        added = await client.put(f"/known-values/payee/{value}", headers=auth(**ADMIN))
        assert added.status_code == 200, added.text
    cases = []
    for scenario in SCENARIOS:
        expected, run = await decided_live(client, auth, scenario)
        case: dict[str, Any] = {
            "name": scenario.name,
            "as": scenario.who,
            "propose": {"tool": scenario.tool, "arguments": scenario.arguments},
            "expect": expected,
        }
        if run is not None:
            case["run"] = run
        cases.append(case)
    assert {c["expect"]["code"] for c in cases} >= CODES, "a code no scenario reached"
    assert {"task", "trusted_result", "known", "none"} <= {
        source for c in cases for source in c["expect"]["endorsement"].values()
    }
    document = {
        "catalog": str(catalog),
        "principals": PRINCIPALS,
        "owners": owners(),
        "known": KNOWN,
        "cases": cases,
    }
    path = write(tmp_path, document)
    status, out, err = toolgate_test(capsys, str(path))
    assert (status, err) == (0, ""), out
    assert out.strip() == f"{len(SCENARIOS)} passed, 0 failed"
    # And not by accident: the offline decisions themselves equal the live ones.
    outcomes = offline.run_file(path)
    assert [o.differences for o in outcomes] == [{}] * len(SCENARIOS)


def owners() -> dict[str, dict[str, dict[str, str | None]]]:
    """Who owns each resource, as the demo providers answer their owner lookups."""
    return {
        "order": {o[0]: {"tenant": o[1], "user": o[2]} for o in ORDERS},
        "customer": {c[0]: {"tenant": c[1], "user": c[2]} for c in CUSTOMERS},
        "service": {s[0]: {"tenant": s[1], "user": None} for s in SERVICES},
        "account": {a[0]: {"tenant": a[1], "user": a[2]} for a in ACCOUNTS},
    }


def test_a_known_value_of_one_users_own_endorses_only_their_calls(
    tmp_path: Path, catalog_dir: Path
) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "demo.yaml").write_text((catalog_dir / "demo.yaml").read_text())
    (catalog / "bank.yaml").write_text(ENDORSED.replace("MODE", "deny"))
    gym = pay("Gym Ltd")
    document = {
        "catalog": str(catalog),
        "principals": {
            name: {"tenant": "acme", "roles": ["support"]} for name in ("alice", "carl")
        },
        "owners": owners(),
        "known": {"acme": {"payee": ["City Power", {"value": "Gym Ltd", "user": "alice"}]}},
        "cases": [
            {
                "name": "alice's own payee",
                "as": "alice",
                "propose": {"tool": "send_money", "arguments": gym},
                "expect": {"decision": "allow", "endorsement": {"recipient": "known"}},
            },
            {
                "name": "not carl's",
                "as": "carl",
                "propose": {"tool": "send_money", "arguments": gym},
                "expect": {"decision": "deny", "code": "unendorsed_arguments"},
            },
        ],
    }
    outcomes = offline.run_file(write(tmp_path, document))
    assert [o.differences for o in outcomes] == [{}, {}]
