"""Who may vouch, and for whom: ``remember`` on ``POST /approve`` makes a known value only
when every approver of the call's quorum asked for it, for the tenant unless an approver is
the call's own actor (then for that user alone), never for a sensitive argument, and never
past its call's rejection or lapsed approvals; digests are keyed. Over HTTP against real
PostgreSQL, Redis and the demo bank, which counts transfers."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app import cli
from app.db import Database
from app.known import digests
from app.known import service as known
from app.progress import quiet
from app.runs.comparison import form
from app.settings import ConfigError, Settings
from tests.conftest import KNOWN_VALUES_KEY, Providers, running_app
from tests.flows import BOB, Flow, new_key
from tests.test_endorsement import ENDORSED, reached, transfer

ALICE = {"sub": "alice", "roles": "support"}
CARL = {"sub": "carl", "roles": "support"}
FIONA = {"sub": "fiona", "roles": "finance_approver"}
ADMIN = {"sub": "root", "roles": "admin"}
ACCOUNT = {"account_id": "acc_1"}
MALLORY = "Mallory Ltd"

APPROVE = ENDORSED.replace("MODE", "approve").replace(
    "reference: {type: string, maxLength: 140, x-sensitive: true}",
    "reference: {type: string, maxLength: 140, x-sensitive: true, x-endorsed: true}",
)
SELF_APPROVED = APPROVE.replace(  # find_transactions: unendorsed is refused outright
    '    approval: {approvers: [actor, "role:finance_approver"], ttl_s: 300}\n'
    "    parameters:\n      type: object\n      additionalProperties: false\n"
    "      required: [account_id, counterparty]",
    "    on_unendorsed: deny\n    parameters:\n      type: object\n"
    "      additionalProperties: false\n      required: [account_id, counterparty]",
)
QUORUM = SELF_APPROVED.replace(
    'approval: {approvers: [actor, "role:finance_approver"], ttl_s: 300,',
    'approval: {approvers: ["role:finance_approver"], ttl_s: 300, quorum: 2,',
)


@pytest.fixture(scope="module")
def catalogs(tmp_path_factory: pytest.TempPathFactory, catalog_dir: Path) -> dict[str, str]:
    assert SELF_APPROVED != APPROVE
    assert QUORUM != SELF_APPROVED
    made = {}
    for name, text in (("self", SELF_APPROVED), ("quorum", QUORUM)):
        directory = tmp_path_factory.mktemp(f"vouching_{name}")
        (directory / "demo.yaml").write_text((catalog_dir / "demo.yaml").read_text())
        (directory / "bank.yaml").write_text(text)
        made[name] = str(directory)
    return made


@pytest.fixture(scope="module")
async def self_approving(
    env: dict[str, str], catalogs: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app({**env, "TOOLGATE_CATALOG": catalogs["self"]}) as client:
        yield client


@pytest.fixture(scope="module")
async def two_person(
    env: dict[str, str], catalogs: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app({**env, "TOOLGATE_CATALOG": catalogs["quorum"]}) as client:
        yield client


@pytest.fixture
def bank(self_approving: httpx.AsyncClient, auth: Any, clean: None, providers: Providers) -> Flow:
    return Flow(self_approving, auth)


@pytest.fixture
def pair(two_person: httpx.AsyncClient, auth: Any, clean: None, providers: Providers) -> Flow:
    return Flow(two_person, auth)


async def previewed(
    flow: Flow, args: dict[str, Any], who: dict[str, str] = ALICE
) -> tuple[str, str]:
    """A transfer proposed (it needs an approval: nobody vouches for its recipient) and
    previewed: its call id and snapshot hash."""
    proposal = await flow.propose("send_money", args, who)
    assert (proposal["impact"], proposal["next"]) == ("high", "dry_run"), proposal
    preview = await flow.dry_run(proposal["call_id"], who)
    return proposal["call_id"], preview["snapshot_hash"]


async def decide(
    flow: Flow,
    call_id: str,
    snapshot: str,
    who: dict[str, str],
    decision: str = "approve",
    remember: list[str] | None = None,
) -> httpx.Response:
    body: dict[str, Any] = {"call_id": call_id, "snapshot_hash": snapshot, "decision": decision}
    if remember is not None:
        body["remember"] = remember
    return await flow.post("/approve", body, who)


async def transfers(providers: Providers) -> int:
    """Transfers the bank made (previews are no effect)."""
    return (await providers.stats())["effects_by_path"].get("/bank/transfers", 0)  # type: ignore[no-any-return]


async def endorsed_by(flow: Flow, recipient: str, who: dict[str, str] = ALICE) -> str | None:
    proposal = await flow.propose("send_money", transfer(recipient), who)
    return proposal["endorsement"][0]["source"]  # type: ignore[no-any-return]


async def test_a_value_one_approver_of_two_remembered_is_not_known_once_the_other_rejects(
    pair: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(pair, transfer(MALLORY))
    first = await decide(pair, call_id, snapshot, BOB, remember=["recipient"])
    assert (first.status_code, first.json()["approvals"]) == (200, "1/2")
    assert await db.fetchval("SELECT count(*) FROM known_values") == 0  # not yet the quorum's
    assert await endorsed_by(pair, MALLORY) is None
    rejected = await decide(pair, call_id, snapshot, FIONA, "reject")
    assert rejected.status_code == 200, rejected.text
    assert await db.fetchval("SELECT count(*) FROM known_values") == 0
    again = await pair.propose("send_money", transfer(MALLORY))
    assert (again["next"], again["endorsement"][0]["endorsed"]) == ("dry_run", False)
    ran = await pair.execute("send_money", transfer(MALLORY), new_key())
    assert (ran.status_code, ran.json()["code"]) == (403, "approval_required")
    assert await transfers(providers) == 0


async def test_only_what_every_approver_of_the_quorum_remembers_becomes_known(
    pair: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    message = "Rent, see https://lease.example/terms"
    call_id, snapshot = await previewed(pair, transfer(MALLORY, message=message))
    await decide(pair, call_id, snapshot, BOB, remember=["recipient", "message"])
    second = await decide(pair, call_id, snapshot, FIONA, remember=["recipient"])
    assert (second.status_code, second.json()["approvals"]) == (200, "2/2")
    rows = await db.fetch("SELECT kind, value, user_sub, call_id, added_by FROM known_values")
    assert [tuple(r) for r in rows] == [("payee", form(MALLORY), None, call_id, "fiona")]
    assert await endorsed_by(pair, MALLORY, CARL) == "known"  # the tenant's: anyone's calls
    listed = await pair.client.get("/known-values/payee", headers=pair.auth(**ADMIN))
    [item] = listed.json()["items"]
    assert (item["scope"], item["user"], item["added_by"], item["call_id"]) == (
        "tenant",
        None,
        "fiona",
        call_id,
    )
    assert item["until"] is not None  # pending: its call has not run
    events = await db.fetch(
        "SELECT actor, outcome FROM audit_events WHERE event = 'remembered' ORDER BY seq"
    )
    assert [(e["actor"], e["outcome"]["approvers"]) for e in events] == [
        ("fiona", ["bob", "fiona"])
    ]


async def test_a_value_its_own_actor_vouched_for_endorses_only_that_users_calls(
    bank: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(bank, transfer(MALLORY))
    approved = await decide(bank, call_id, snapshot, ALICE, remember=["recipient"])
    assert approved.status_code == 200, approved.text
    row = await db.fetchrow("SELECT user_sub, until FROM known_values")
    assert row is not None
    assert row["user_sub"] == "alice"
    paid = await bank.execute("send_money", transfer(MALLORY), new_key(), call_id=call_id)
    assert paid.json()["status"] == "succeeded", paid.text
    assert await db.fetchval("SELECT until FROM known_values") is None  # its call ran: for good
    assert await endorsed_by(bank, MALLORY, ALICE) == "known"
    assert await endorsed_by(bank, MALLORY, CARL) is None
    mine = await bank.post(
        "/execute",
        {"tool": "find_transactions", "arguments": {**ACCOUNT, "counterparty": MALLORY}},
        ALICE,
    )
    assert mine.status_code == 200, mine.text
    theirs = await bank.post(
        "/execute",
        {"tool": "find_transactions", "arguments": {**ACCOUNT, "counterparty": MALLORY}},
        CARL,
    )
    assert (theirs.status_code, theirs.json()["code"]) == (403, "unendorsed_arguments")
    assert len(await reached(providers, "/bank/accounts/acc_1/transactions")) == 1  # alice's
    assert await transfers(providers) == 1
    listed = await bank.client.get("/known-values/payee", headers=bank.auth(**ADMIN))
    [item] = listed.json()["items"]
    assert (item["scope"], item["user"], item["added_by"], item["until"]) == (
        "user",
        "alice",
        "alice",
        None,
    )


async def test_an_approvers_value_lapses_with_the_approval_its_call_never_used(
    bank: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(bank, transfer(MALLORY))
    await decide(bank, call_id, snapshot, BOB, remember=["recipient"])
    assert await endorsed_by(bank, MALLORY, CARL) == "known"
    await db.execute("UPDATE approvals SET expires_at = now() - interval '1 second'")
    await db.execute("UPDATE known_values SET until = now() - interval '1 second'")
    assert await endorsed_by(bank, MALLORY, CARL) is None
    listed = await bank.client.get("/known-values/payee", headers=bank.auth(**ADMIN))
    assert listed.json()["items"] == []
    ran = await bank.execute("send_money", transfer(MALLORY), new_key(), call_id=call_id)
    assert (ran.status_code, ran.json()["code"]) == (403, "approval_expired")
    assert await transfers(providers) == 0


async def test_a_released_execution_gives_its_values_their_deadline_back(
    bank: Flow, db: asyncpg.Connection
) -> None:
    """Nothing ran (the provider was never reached): the call is approved again, and what
    its approvals vouched for lapses with them, as before it started."""
    call_id, snapshot = await previewed(bank, transfer(MALLORY))
    await decide(bank, call_id, snapshot, BOB, remember=["recipient"])
    expires = await db.fetchval("SELECT expires_at FROM approvals")
    await db.execute("UPDATE calls SET state = 'executing' WHERE id = $1", call_id)
    assert await db.fetchval("SELECT until FROM known_values") is None
    await db.execute("UPDATE calls SET state = 'approved' WHERE id = $1", call_id)
    assert await db.fetchval("SELECT until FROM known_values") == expires
    await db.execute("UPDATE calls SET state = 'executing' WHERE id = $1", call_id)
    await db.execute("UPDATE calls SET state = 'proposed' WHERE id = $1", call_id)
    assert await db.fetchval("SELECT until FROM known_values") == expires  # ran unapproved


async def test_a_sensitive_argument_is_never_remembered(
    bank: Flow, providers: Providers, db: asyncpg.Connection
) -> None:
    call_id, snapshot = await previewed(bank, transfer(MALLORY, reference="hunter2"))
    refused = await decide(bank, call_id, snapshot, BOB, remember=["recipient", "reference"])
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_request")
    assert "reference" in refused.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM approvals") == 0
    assert await db.fetchval("SELECT count(*) FROM known_values") == 0
    assert await db.fetchval("SELECT state FROM calls WHERE id = $1", call_id) == (
        "awaiting_approval"
    )
    assert await transfers(providers) == 0


def plain_digests(kind: str, value: str) -> set[str]:
    """What an unkeyed digest of ``value`` could look like, as older versions wrote it or
    a word list would try it."""
    forms = {value, value.lower(), form(value), "".join(c for c in value.lower() if c.isalnum())}
    return {
        hashlib.sha256(material.encode()).hexdigest()
        for written in forms
        for material in (written, f"{kind}\0{written}")
    }


async def test_the_table_and_audit_trail_hold_only_keyed_digests(
    bank: Flow, db: asyncpg.Connection
) -> None:
    kind = "send_money.reference"  # a sensitive argument's kind: only its digest is kept
    added = await bank.client.put(f"/known-values/{kind}/hunter2", headers=bank.auth(**ADMIN))
    assert added.status_code == 200, added.text
    assert added.json()["value"] is None
    key = KNOWN_VALUES_KEY.encode()
    assert added.json()["digest"] == digests.digest(key, kind, "hunter2")
    assert added.json()["digest"].startswith(digests.under(key))
    call_id, snapshot = await previewed(bank, transfer(MALLORY))
    await decide(bank, call_id, snapshot, BOB, remember=["recipient"])
    stored = " ".join(
        [
            str(await db.fetch("SELECT * FROM known_values")),
            str(await db.fetch("SELECT * FROM audit_events")),
        ]
    )
    for plain in plain_digests(kind, "hunter2") | plain_digests("payee", MALLORY):
        assert plain not in stored
    assert "hunter2" not in stored


async def test_an_admin_removes_a_value_in_every_scope(
    bank: Flow, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    call_id, snapshot = await previewed(bank, transfer(MALLORY))
    await decide(bank, call_id, snapshot, ALICE, remember=["recipient"])
    put = await bank.client.put(f"/known-values/payee/{MALLORY}", headers=bank.auth(**ADMIN))
    assert put.status_code == 200, put.text
    monkeypatch.setattr(known, "PAGE_SIZE", 1)
    first = (await bank.client.get("/known-values/payee", headers=bank.auth(**ADMIN))).json()
    second = (
        await bank.client.get(
            "/known-values/payee",
            params={"cursor": first["next_cursor"]},
            headers=bank.auth(**ADMIN),
        )
    ).json()
    assert sorted(i["scope"] for i in first["items"] + second["items"]) == ["tenant", "user"]
    assert second["next_cursor"] is None
    removed = await bank.client.delete(
        f"/known-values/payee/{MALLORY.upper()}", headers=bank.auth(**ADMIN)
    )
    assert removed.json()["removed"] is True
    assert await db.fetchval("SELECT count(*) FROM known_values") == 0
    assert await db.fetchval("SELECT count(*) FROM audit_events WHERE event = 'forgotten'") == 2


async def test_values_from_before_keys_are_digested_again_or_removed_and_told(
    settings: Settings, db: asyncpg.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    old = {  # what 0020's digests looked like: a plain hash, which nothing matches now
        value: "sha256:" + hashlib.sha256(f"payee\0{value}".encode()).hexdigest()
        for value in ("city power", "hunter2")
    }
    await db.executemany(
        "INSERT INTO known_values (tenant, kind, digest, value, added_by) VALUES"
        " ('acme', 'payee', $1, $2, $3)",
        [(old["city power"], "City Power", "root"), (old["hunter2"], None, "bob")],
    )
    await cli._migrate(settings, quiet)
    told = capsys.readouterr().err
    assert "1 digested under the current key" in told
    assert "removed a sensitive 'payee' of tenant 'acme' for the tenant, added by 'bob'" in told
    rows = await db.fetch("SELECT digest, value FROM known_values")
    key = KNOWN_VALUES_KEY.encode()
    assert [tuple(r) for r in rows] == [(digests.digest(key, "payee", "City Power"), "City Power")]
    [event] = await db.fetch("SELECT actor, outcome FROM audit_events WHERE event = 'withdrawn'")
    assert (event["actor"], event["outcome"]["digest"]) == ("toolgate", None)
    assert old["hunter2"].removeprefix("sha256:") not in str(event["outcome"])


async def test_a_rotation_keeps_sensitive_values_under_the_previous_key(
    settings: Settings, db: asyncpg.Connection
) -> None:
    previous, current = KNOWN_VALUES_KEY.encode(), b"n" * 32
    await db.executemany(
        "INSERT INTO known_values (tenant, kind, digest, value, added_by) VALUES"
        " ('acme', 'payee', $1, $2, 'root')",
        [
            (digests.digest(previous, "payee", "City Power"), "city power"),
            (digests.digest(previous, "payee", "hunter2"), None),
        ],
    )
    database = Database(settings.check_database())
    await database.open(min_size=1, max_size=1)
    try:
        done = await known.rekey(database, (current, previous))
    finally:
        await database.close()
    assert (done.redigested, done.kept, done.removed) == (1, 1, [])
    stored = {r["digest"] for r in await db.fetch("SELECT digest FROM known_values")}
    assert stored == {
        digests.digest(current, "payee", "City Power"),
        digests.digest(previous, "payee", "hunter2"),
    }


async def test_without_a_key_known_values_are_off(
    env: dict[str, str], catalogs: dict[str, str], auth: Any, clean: None, db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO known_values (tenant, kind, digest, value, added_by) VALUES"
        " ('acme', 'payee', $1, 'mallory ltd', 'root')",
        digests.digest(KNOWN_VALUES_KEY.encode(), "payee", MALLORY),
    )
    keyless = {**env, "TOOLGATE_CATALOG": catalogs["self"], "TOOLGATE_KNOWN_VALUES_KEY": ""}
    async with running_app(keyless) as client:
        flow = Flow(client, auth)
        assert await endorsed_by(flow, MALLORY) is None
        put = await client.put("/known-values/payee/City Power", headers=auth(**ADMIN))
        assert (put.status_code, put.json()["code"]) == (400, "invalid_request")
        call_id, snapshot = await previewed(flow, transfer(MALLORY))
        refused = await decide(flow, call_id, snapshot, BOB, remember=["recipient"])
        assert (refused.status_code, refused.json()["code"]) == (400, "invalid_request")
    assert await db.fetchval("SELECT count(*) FROM approvals") == 0


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"TOOLGATE_KNOWN_VALUES_KEY": "short"}, "at least 32 bytes"),
        ({"TOOLGATE_KNOWN_VALUES_PREVIOUS_KEY": "p" * 32}, "without TOOLGATE_KNOWN_VALUES_KEY"),
        (
            {"TOOLGATE_KNOWN_VALUES_KEY": "k" * 32, "TOOLGATE_KNOWN_VALUES_PREVIOUS_KEY": "k" * 32},
            "is the current key",
        ),
    ],
)
def test_a_known_values_key_that_cannot_work_is_refused(
    given: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        Settings.from_env(given)
    assert Settings.from_env({}).known_values_keys == ()
