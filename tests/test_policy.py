"""The pure decision: no database, no network — the many fast tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from app.auth.principal import Principal
from app.calls import policy
from app.calls.policy import Facts
from app.catalog.models import Catalog, Owner
from app.consent import rules
from app.errors import IdentitySpoof, InvalidArguments, ToolForbidden
from tests.catalogs import small_catalog

ALICE = Principal("alice", "acme", frozenset({"support"}))
ACME = Owner("acme", "dave")


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return small_catalog(tmp_path_factory.mktemp("catalog"))


def refund(catalog: Catalog, **overrides: object) -> policy.PreparedCall:
    args = {"order_id": "ord_1", "amount": 50, "customer_id": "alice", **overrides}
    return policy.prepare(catalog.tools["issue_refund"], args)


def facts(owner: Owner | None = ACME, **addresses: tuple[str, ...]) -> Facts:
    return Facts(owners={"order_id": owner, "customer_id": owner}, addresses=addresses)


def test_defaults_are_filled_and_the_target_is_the_first_resource(catalog: Catalog) -> None:
    call = refund(catalog)
    assert call.arguments == {
        "order_id": "ord_1",
        "amount": 50,
        "customer_id": "alice",
        "currency": "EUR",
    }
    assert call.target == policy.Target("order", "ord_1")


def test_key_order_and_whitespace_never_change_the_fingerprint(catalog: Catalog) -> None:
    tool = catalog.tools["issue_refund"]
    a = policy.prepare(tool, {"amount": 50, "customer_id": "alice", "order_id": "ord_1"})
    b = policy.prepare(tool, {"order_id": "ord_1", "customer_id": "alice", "amount": 50.0})
    assert a.fingerprint == b.fingerprint
    assert a.fingerprint.startswith("sha256:")
    assert len(a.fingerprint) == 7 + 64


def test_an_explicit_default_value_fingerprints_like_the_omitted_one(catalog: Catalog) -> None:
    assert refund(catalog).fingerprint == refund(catalog, currency="EUR").fingerprint
    assert refund(catalog).fingerprint != refund(catalog, currency="USD").fingerprint


def test_fingerprint_is_sha256_of_the_canonical_document() -> None:
    import hashlib

    expected = hashlib.sha256(
        b'{"arguments":{"a":1,"b":"x"},"target":{"id":"o","type":"order"},"tool":"t"}'
    ).hexdigest()
    got = policy.fingerprint("t", policy.Target("order", "o"), {"b": "x", "a": 1})
    assert got == "sha256:" + expected


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({"order_id": "ord_1", "amount": -1, "customer_id": "alice"}, "/amount"),
        ({"order_id": "ord_1", "amount": 50, "customer_id": "alice", "extra": 1}, "/"),
        ({"order_id": "ord_1", "customer_id": "alice"}, "/"),
        (
            {"order_id": "ord_1", "amount": 50, "customer_id": "alice", "currency": "GBP"},
            "/currency",
        ),
        (
            {"order_id": "ord_1", "amount": 50, "customer_id": "alice", "notify_url": "not a url"},
            "/notify_url",
        ),
    ],
)
def test_schema_violations_are_invalid_arguments_with_paths(
    catalog: Catalog, args: dict[str, object], path: str
) -> None:
    with pytest.raises(InvalidArguments) as caught:
        policy.prepare(catalog.tools["issue_refund"], args)
    assert path in [e["path"] for e in caught.value.extra["errors"]]


def test_an_argument_naming_another_user_is_identity_spoof(catalog: Catalog) -> None:
    with pytest.raises(IdentitySpoof):
        policy.decide(ALICE, refund(catalog, customer_id="mallory"), facts())


def test_an_argument_naming_another_tenant_is_identity_spoof(catalog: Catalog) -> None:
    call = policy.prepare(
        catalog.tools["update_email"],
        {"customer_id": "ord_1", "email": "a@b.c", "tenant_id": "globex"},
    )
    with pytest.raises(IdentitySpoof):
        policy.precheck(ALICE, call)


def test_identity_is_checked_before_roles(catalog: Catalog) -> None:
    nobody = Principal("alice", "acme", frozenset())
    with pytest.raises(IdentitySpoof):
        policy.precheck(nobody, refund(catalog, customer_id="bob"))


def test_a_principal_without_a_listed_role_is_forbidden(catalog: Catalog) -> None:
    customer = Principal("alice", "acme", frozenset({"customer"}))
    with pytest.raises(ToolForbidden):
        policy.decide(customer, refund(catalog), facts())


def test_another_tenants_resource_and_a_missing_one_look_the_same(catalog: Catalog) -> None:
    errors = []
    for owner in (Owner("globex", "carol"), None):
        with pytest.raises(ToolForbidden) as caught:
            policy.decide(ALICE, refund(catalog), facts(owner))
        errors.append(caught.value.problem())
    assert errors[0] == errors[1]


def test_owner_user_access_needs_the_session_user(catalog: Catalog) -> None:
    call = policy.prepare(catalog.tools["update_email"], {"customer_id": "ord_1", "email": "x"})
    with pytest.raises(ToolForbidden):
        policy.decide(ALICE, call, Facts({"customer_id": Owner("acme", "dave")}, {}))
    decision = policy.decide(ALICE, call, Facts({"customer_id": Owner("acme", "alice")}, {}))
    assert (decision.impact, decision.next) == ("high", "approval")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.1",
        "172.16.5.5",
        "169.254.169.254",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "fc00::1",
        "0.0.0.0",
        "100.64.0.1",
    ],
)
def test_egress_to_a_non_public_address_is_refused(catalog: Catalog, address: str) -> None:
    call = refund(catalog, notify_url="https://hooks.example/x")
    with pytest.raises(ToolForbidden):
        policy.decide(ALICE, call, facts(notify_url=("93.184.216.34", address)))


def test_egress_to_public_addresses_is_allowed(catalog: Catalog) -> None:
    call = refund(catalog, notify_url="https://hooks.example/x")
    assert policy.decide(ALICE, call, facts(notify_url=("93.184.216.34", "2606:4700::1")))


@pytest.mark.parametrize(
    "url", ["ftp://93.184.216.34/x", "file:///etc/passwd", "https://", "http://h:99999/"]
)
def test_egress_urls_must_be_http_with_a_host(catalog: Catalog, url: str) -> None:
    call = refund(catalog, notify_url=url)
    with pytest.raises(ToolForbidden):
        policy.decide(ALICE, call, facts(notify_url=("93.184.216.34",)))


def test_an_unresolvable_egress_host_is_refused(catalog: Catalog) -> None:
    with pytest.raises(ToolForbidden):
        policy.decide(ALICE, refund(catalog, notify_url="https://nowhere.invalid/"), facts())


@pytest.mark.parametrize(
    ("amount", "impact", "next_step"),
    [(100, "low", "dry_run"), (100.0, "low", "dry_run"), (100.01, "high", "dry_run")],
)
def test_high_impact_when_raises_impact(
    catalog: Catalog, amount: float, impact: str, next_step: str
) -> None:
    decision = policy.decide(ALICE, refund(catalog, amount=amount), facts())
    assert (decision.impact, decision.next) == (impact, next_step)


def test_a_cel_evaluation_error_fails_closed_to_high_impact(
    tmp_path: Path, catalog: Catalog
) -> None:
    from app.catalog.loader import load
    from tests.catalogs import BASE, write

    text = BASE.replace('"args.amount > 100.0"', '"args.note.size() > 3"')
    tool = load(write(tmp_path, text), {}).tools["issue_refund"]
    call = policy.prepare(tool, {"order_id": "ord_1", "amount": 1, "customer_id": "alice"})
    assert policy.impact_of(ALICE, call) == "high"


def test_reads_need_only_execute(catalog: Catalog) -> None:
    call = policy.prepare(catalog.tools["get_order"], {"order_id": "ord_1"})
    decision = policy.decide(ALICE, call, Facts({"order_id": ACME}, {}))
    assert (decision.impact, decision.next) == ("read", "execute")


def test_a_high_impact_tool_without_dry_run_goes_straight_to_approval(catalog: Catalog) -> None:
    assert policy.next_step(catalog.tools["update_email"], "high") == "approval"


def test_an_omitted_identity_argument_is_the_sessions_own(catalog: Catalog) -> None:
    tool = catalog.tools["issue_refund"]
    sent = {"order_id": "ord_1", "amount": 50}
    call = policy.prepare(tool, policy.completed(tool, ALICE, sent))
    assert call.arguments["customer_id"] == "alice"
    assert sent == {"order_id": "ord_1", "amount": 50}
    tenant_tool = catalog.tools["update_email"]
    filled = policy.completed(
        tenant_tool, ALICE, {"customer_id": "c", "email": "e", "tenant_id": None}
    )
    assert filled["tenant_id"] == "acme"


def test_a_supplied_identity_argument_is_kept_and_checked(catalog: Catalog) -> None:
    tool = catalog.tools["issue_refund"]
    sent = {"order_id": "ord_1", "amount": 50, "customer_id": "bob"}
    call = policy.prepare(tool, policy.completed(tool, ALICE, sent))
    with pytest.raises(IdentitySpoof):
        policy.precheck(ALICE, call)


def test_null_for_an_optional_argument_is_absent_and_gets_its_default(catalog: Catalog) -> None:
    assert refund(catalog, currency=None, note=None).arguments == refund(catalog).arguments
    assert refund(catalog, currency=None).arguments["currency"] == "EUR"


def test_null_for_a_required_argument_is_still_invalid(catalog: Catalog) -> None:
    with pytest.raises(InvalidArguments):
        refund(catalog, amount=None)


ORDER_LINES = """
version: "t1"
providers:
  shop: {base_url: "http://127.0.0.1:9"}
tools:
  place_order:
    mutation: true
    provider: shop
    execute: {method: POST, path: /orders}
    parameters:
      type: object
      additionalProperties: false
      required: [lines]
      properties:
        lines:
          type: array
          items:
            type: object
            additionalProperties: false
            required: [sku]
            properties:
              sku: {type: string}
              quantity: {type: integer, default: 1}
        ship_to: {$ref: "#/$defs/address"}
      $defs:
        address:
          type: object
          additionalProperties: false
          required: [city]
          properties:
            city: {type: string}
            postcode: {type: string}
"""


def test_null_inside_array_items_and_referenced_objects_is_absent_as_strict_mode_sends_it(
    tmp_path: Path,
) -> None:
    """The strict schema ``GET /catalog`` shows makes optional properties nullable at every
    object level, those of array items and of ``$defs`` included; a model that sends the
    ``null`` it was told to send makes the call it means, not an invalid one."""
    from app.catalog.listing import strict_schema
    from app.catalog.loader import load
    from tests.catalogs import write

    tool = load(write(tmp_path, ORDER_LINES), {}).tools["place_order"]
    sent = {
        "lines": [{"sku": "a", "quantity": None}],
        "ship_to": {"city": "Oslo", "postcode": None},
    }
    jsonschema.validate(sent, strict_schema(tool.public_parameters))
    written = {"lines": [{"sku": "a", "quantity": 1}], "ship_to": {"city": "Oslo"}}
    assert policy.prepare(tool, sent).arguments == written
    assert policy.prepare(tool, sent).fingerprint == policy.prepare(tool, written).fingerprint
    with pytest.raises(InvalidArguments):
        policy.prepare(tool, {"lines": [{"sku": None}]})


@pytest.mark.parametrize(
    "roles",
    [
        set(),
        {"support"},
        {"finance_approver"},
        {"support_lead"},
        {"finance_approver", "support_lead"},
    ],
)
def test_the_inbox_reads_by_tool_exactly_what_may_approve_allows(
    catalog: Catalog, roles: set[str]
) -> None:
    """The inbox's query keeps calls by tool and actor (``decidable``); /approve judges each
    call (``may_approve``): they must agree on every tool, for the actor and anyone else."""
    approver = Principal("bob", "acme", frozenset(roles))
    decidable = rules.decidable(approver, catalog.tools)
    assert decidable.approver == "bob"
    for name, tool in catalog.tools.items():
        approvers = tool.approval.approvers if tool.approval else None
        for actor, listed in (("bob", decidable.own), ("alice", decidable.others)):
            allowed = approvers is not None and rules.may_approve(
                approver, actor, "acme", approvers
            )
            assert (name in listed) == allowed, (name, actor)
    assert decidable.own == ["issue_refund"], "owner lets anyone decide their own refunds"


SHELVES = """
version: "t1"
providers:
  shop: {base_url: "http://127.0.0.1:9"}
tools:
  clear_shelf:
    mutation: true
    provider: shop
    execute: {method: DELETE, path: "/shelves/{shelf}"}
    high_impact_when: "args.shelf / 2 > 50"
    approval: {approvers: [actor]}
    parameters:
      type: object
      additionalProperties: false
      required: [shelf]
      properties:
        shelf: {type: integer}
        keep: {type: number, default: 2.0}
        labels: {type: array, items: {type: number}}
"""


@pytest.mark.parametrize(
    ("sent", "normalized"),
    [
        ({"shelf": 101.0}, {"shelf": 101, "keep": 2}),
        ({"shelf": 1e2, "keep": -0.0}, {"shelf": 100, "keep": 0}),
        ({"shelf": 7, "labels": [1.0, 1.5]}, {"shelf": 7, "keep": 2, "labels": [1, 1.5]}),
    ],
)
def test_numbers_are_normalized_as_the_canonical_json_the_fingerprint_hashes(
    tmp_path: Path, sent: dict[str, Any], normalized: dict[str, Any]
) -> None:
    """``101.0`` and ``101`` are one number to RFC 8785, so they share a fingerprint (and
    an approval, and an idempotency key); the call sent must be the same too, not
    ``DELETE /shelves/101.0`` for a call approved as ``/shelves/101``, nor a CEL ``/``
    that divides one as a double and the other as an integer (another impact)."""
    from app.catalog.loader import load
    from app.providers import build_request
    from tests.catalogs import write

    tool = load(write(tmp_path, SHELVES), {}).tools["clear_shelf"]
    got, expected = policy.prepare(tool, sent), policy.prepare(tool, normalized)
    assert got.fingerprint == expected.fingerprint
    assert json.dumps(got.arguments, sort_keys=True) == json.dumps(normalized, sort_keys=True)
    assert build_request(tool.provider, tool.execute, got.arguments) == build_request(
        tool.provider, tool.execute, normalized
    )
    assert policy.impact_of(ALICE, got) == policy.impact_of(ALICE, expected)
