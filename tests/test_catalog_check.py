"""What ``toolgate check`` refuses (docs/catalog.md), each problem located by file, line and path.

Every case mutates ``tests.catalogs.BASE`` by one edit; expected lines are computed from the
mutated text, so a problem must point at the line that holds the offending node.
"""

from __future__ import annotations

import http.server
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.catalog.loader import CatalogError, load
from app.catalog.models import Endorsed, EndorsedMode
from app.catalog.source import Problem
from tests.catalogs import BASE, write


def line_of(text: str, needle: str) -> int:
    """The 1-based line holding ``needle``, which must occur on exactly one line."""
    hits = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


def block_of(text: str, header: str) -> range:
    """The lines of the mapping introduced by the line ``header`` (e.g. ``"  issue_refund:"``)."""
    lines = text.splitlines()
    start = line_of(text, header)
    indent = len(header) - len(header.lstrip())
    end = start
    while end < len(lines):
        following = lines[end]
        if following.strip() and len(following) - len(following.lstrip()) <= indent:
            break
        end += 1
    return range(start, end + 1)


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def problems_of(path: Path, env: dict[str, str] | None = None) -> list[Problem]:
    with pytest.raises(CatalogError) as caught:
        load(path, env or {})
    assert caught.value.problems, "a CatalogError must list its problems"
    for problem in caught.value.problems:
        assert str(problem).startswith(f"{problem.file}:{problem.line}: ")
    return caught.value.problems


def at(problems: list[Problem], path: tuple[str | int, ...]) -> Problem:
    """The one problem whose path starts with ``path``."""
    found = [p for p in problems if p.path[: len(path)] == path]
    assert len(found) == 1, f"expected one problem at {path}, got {[str(p) for p in problems]}"
    return found[0]


def test_the_base_catalog_is_valid(tmp_path: Path) -> None:
    catalog = load(write(tmp_path, BASE), {})
    assert set(catalog.tools) == {"get_order", "issue_refund", "update_email"}
    assert catalog.label == "t1"


@dataclass(frozen=True)
class Case:
    old: str
    new: str
    path: tuple[str | int, ...]
    line: str | None = None
    """A substring of the offending line in the mutated text."""
    within: str | None = None
    """For a missing key: the header line of the mapping the problem must point into."""


ROLE = 'approval: {approvers: [actor, "role:finance_approver"], ttl_s: 300}'
REFUND_EXECUTE = "    execute: {method: POST, path: /refunds}\n"

# Places inside a schema where an annotation would not be honoured (line: "hidden").
NOT_HONOURED = {
    "in_a_nested_property": "box: {type: object, properties: {hidden: {type: string, ANNOTATION}}}",
    "in_items": "box: {type: array, items: {type: string, ANNOTATION, title: hidden}}",
    "in_all_of": "box: {allOf: [{type: string, ANNOTATION, title: hidden}]}",
    "in_any_of": "box: {anyOf: [{type: string, ANNOTATION, title: hidden}]}",
    "in_pattern_properties": "box: {type: object, patternProperties: {hidden: {ANNOTATION}}}",
}

CASES: dict[str, Case] = {
    "unknown_tool_key": Case(
        "    result: {fields: [id, status]}\n",
        "    result: {fields: [id, status]}\n    colour: blue\n",
        ("tools", "get_order", "colour"),
        line="colour: blue",
    ),
    "unknown_key_inside_approval": Case(
        ROLE,
        'approval: {approvers: [actor, "role:finance_approver"], ttl_s: 300, escalate: true}',
        ("tools", "issue_refund", "approval", "escalate"),
        line="escalate: true",
    ),
    "empty_segment_in_error_fields": Case(
        "    result: {fields: [id, status]}\n",
        "    result: {fields: [id, status], error_fields: [error, detail..text]}\n",
        ("tools", "get_order", "result", "error_fields", 1),
        line="error_fields: [error, detail..text]",
    ),
    "unknown_top_level_key": Case(
        'version: "t1"\n', 'version: "t1"\nowner: me\n', ("owner",), line="owner: me"
    ),
    "unknown_provider_of_a_tool": Case(
        "    mutation: false\n    provider: billing\n",
        "    mutation: false\n    provider: shipping\n",
        ("tools", "get_order", "provider"),
        line="provider: shipping",
    ),
    "unknown_provider_of_a_resource": Case(
        "  order:\n    provider: billing\n",
        "  order:\n    provider: warehouse\n",
        ("resources", "order", "provider"),
        line="provider: warehouse",
    ),
    "unknown_resource_in_x_resource": Case(
        'pattern: "^ord_[A-Za-z0-9]+$", x-resource: order}',
        'pattern: "^ord_[A-Za-z0-9]+$", x-resource: invoice}',
        ("tools", "get_order", "parameters"),
        line="x-resource: invoice",
    ),
    "invalid_json_schema_type_in_a_property": Case(
        "        email: {type: string}\n",
        "        email: {type: objectx}\n",
        ("tools", "update_email", "parameters"),
        line="email: {type: objectx}",
    ),
    "invalid_json_schema_keyword_value": Case(
        "note: {type: string, maxLength: 500,",
        "note: {type: string, maxLength: -1,",
        ("tools", "issue_refund", "parameters"),
        line="maxLength: -1",
    ),
    "on_taint_approve_on_a_read": Case(
        "    result: {fields: [id, status]}\n",
        "    result: {fields: [id, status]}\n    on_taint: approve\n",
        ("tools", "get_order", "on_taint"),
        line="on_taint: approve",
    ),
    "on_taint_that_is_not_a_choice": Case(
        "    result: {fields: [id, status]}\n",
        "    result: {fields: [id, status]}\n    on_taint: warn\n",
        ("tools", "get_order", "on_taint"),
        line="on_taint: warn",
    ),
    "on_taint_approve_without_an_approval_section": Case(
        '    impact: high\n    approval: {approvers: ["role:support_lead"]}\n',
        "    on_taint: approve\n",
        ("tools", "update_email", "on_taint"),
        line="on_taint: approve",
    ),
    "recheck_without_a_dry_run": Case(
        'approval: {approvers: ["role:support_lead"]}',
        'approval: {approvers: ["role:support_lead"], recheck: true}',
        ("tools", "update_email", "approval", "recheck"),
        line="recheck: true",
    ),
    "cel_that_does_not_compile": Case(
        'high_impact_when: "args.amount > 100.0"',
        'high_impact_when: "args.amount >"',
        ("tools", "issue_refund", "high_impact_when"),
        line='high_impact_when: "args.amount >"',
    ),
    "cel_referencing_another_variable": Case(
        'high_impact_when: "args.amount > 100.0"',
        'high_impact_when: "request.amount > 100.0"',
        ("tools", "issue_refund", "high_impact_when"),
        line="request.amount",
    ),
    "cel_referencing_an_extra_variable": Case(
        'high_impact_when: "args.amount > 100.0"',
        'high_impact_when: "args.amount > limit"',
        ("tools", "issue_refund", "high_impact_when"),
        line="args.amount > limit",
    ),
    "placeholder_with_no_such_argument": Case(
        'execute: {method: GET, path: "/orders/{order_id}"}',
        'execute: {method: GET, path: "/orders/{order}"}',
        ("tools", "get_order", "execute", "path"),
        line='path: "/orders/{order}"',
    ),
    "placeholder_of_an_optional_argument": Case(
        'execute: {method: PATCH, path: "/customers/{customer_id}"}',
        'execute: {method: PATCH, path: "/customers/{customer_id}/{tenant_id}"}',
        ("tools", "update_email", "execute", "path"),
        line="{tenant_id}",
    ),
    "placeholder_of_the_dry_run_path": Case(
        "dry_run: {method: POST, path: /refunds/preview}",
        'dry_run: {method: POST, path: "/refunds/{refund_id}/preview"}',
        ("tools", "issue_refund", "dry_run", "path"),
        line="{refund_id}",
    ),
    "placeholder_of_a_resource_owner_path": Case(
        'owner: {method: GET, path: "/orders/{id}/owner"}',
        'owner: {method: GET, path: "/orders/{order_id}/owner"}',
        ("resources", "order", "owner", "path"),
        line="/orders/{order_id}/owner",
    ),
    "mutation_without_execute": Case(
        REFUND_EXECUTE, "", ("tools", "issue_refund"), within="  issue_refund:"
    ),
    "require_dry_run_without_dry_run": Case(
        "    dry_run: {method: POST, path: /refunds/preview}\n",
        "",
        ("tools", "issue_refund", "require_dry_run"),
        line="require_dry_run: true",
    ),
    "impact_high_without_approval": Case(
        '    approval: {approvers: ["role:support_lead"]}\n',
        "",
        ("tools", "update_email"),
        within="  update_email:",
    ),
    "high_impact_when_without_approval": Case(
        f"    {ROLE}\n", "", ("tools", "issue_refund"), within="  issue_refund:"
    ),
    "unknown_x_annotation": Case(
        "note: {type: string, maxLength: 500, x-sensitive: true}",
        "note: {type: string, maxLength: 500, x-sensitive: true, x-secret: true}",
        ("tools", "issue_refund", "parameters"),
        line="x-secret: true",
    ),
    "sensitive_resource_id": Case(
        "order_id: {type: string, x-resource: order}",
        "order_id: {type: string, x-resource: order, x-sensitive: true}",
        ("tools", "issue_refund", "parameters", "properties", "order_id", "x-sensitive"),
        line="x-resource: order, x-sensitive: true",
    ),
    "misspelt_x_annotation": Case(
        "customer_id: {type: string, x-identity: user}",
        "customer_id: {type: string, x-identiy: user}",
        ("tools", "issue_refund", "parameters"),
        line="x-identiy: user",
    ),
    "unset_env_reference_in_base_url": Case(
        'base_url: "http://127.0.0.1:9"',
        'base_url: "${TOOLGATE_TEST_BILLING_URL}/v1"',
        ("providers", "billing"),
        line="${TOOLGATE_TEST_BILLING_URL}",
    ),
    "max_response_bytes_over_64_mib": Case(
        "timeout_s: 2}",
        "timeout_s: 2, max_response_bytes: 1073741824}",
        ("providers", "billing", "max_response_bytes"),
        line="max_response_bytes: 1073741824",
    ),
    "max_response_bytes_under_1_kib": Case(
        "timeout_s: 2}",
        "timeout_s: 2, max_response_bytes: 0}",
        ("providers", "billing", "max_response_bytes"),
        line="max_response_bytes: 0",
    ),
    "max_response_bytes_not_a_number": Case(
        "timeout_s: 2}",
        "timeout_s: 2, max_response_bytes: lots}",
        ("providers", "billing", "max_response_bytes"),
        line="max_response_bytes: lots",
    ),
    "unset_env_reference_in_a_header": Case(
        "timeout_s: 2}",
        'timeout_s: 2, headers: {X-Api-Key: "${TOOLGATE_TEST_BILLING_KEY}"}}',
        ("providers", "billing"),
        line="${TOOLGATE_TEST_BILLING_KEY}",
    ),
    "header_value_with_a_line_break": Case(
        "timeout_s: 2}",
        'timeout_s: 2, headers: {X-Api-Key: "k\\r\\nX-Tenant: other"}}',
        ("providers", "billing", "headers", "X-Api-Key"),
        line="X-Api-Key",
    ),
    "header_name_that_is_no_token": Case(
        "timeout_s: 2}",
        'timeout_s: 2, headers: {"X Api Key": k}}',
        ("providers", "billing", "headers", "X Api Key"),
        line="X Api Key",
    ),
    **{
        f"x_resource_typed_{name}": Case(
            'order_id: {type: string, pattern: "^ord_[A-Za-z0-9]+$", x-resource: order}',
            f"order_id: {{{schema}x-resource: order}}",
            ("tools", "get_order", "parameters", "properties", "order_id", "x-resource"),
            line=f"order_id: {{{schema}x-resource",
        )
        for name, schema in {
            "nothing": "",
            "number": "type: number, ",
            "boolean": "type: boolean, ",
            "array": "type: array, ",
            "object": "type: object, ",
            "null": 'type: "null", ',
            "a_list": "type: [string, integer], ",
            "a_list_of_one": "type: [string], ",
        }.items()
    },
    **{
        f"x_egress_typed_{name}": Case(
            "notify_url: {type: string, format: uri, x-egress: public}",
            f"notify_url: {{{schema}format: uri, x-egress: public}}",
            ("tools", "issue_refund", "parameters", "properties", "notify_url", "x-egress"),
            line=f"notify_url: {{{schema}format",
        )
        for name, schema in {
            "nothing": "",
            "object": "type: object, ",
            "a_list": 'type: [string, "null"], ',
        }.items()
    },
    **{
        f"{annotation.replace('-', '_')}_{name}": Case(
            "        email: {type: string}\n",
            "        email: {type: string}\n        "
            + where.replace("ANNOTATION", f"{annotation}: {value}")
            + "\n",
            ("tools", "update_email", "parameters"),
            line="hidden",
        )
        for annotation, value in {
            "x-resource": "order",
            "x-identity": "user",
            "x-egress": "public",
            "x-endorsed": "true",
        }.items()
        for name, where in NOT_HONOURED.items()
    },
    **{
        f"x_endorsed_{name}": Case(
            "        email: {type: string}\n",
            f"        email: {{{schema}}}\n",
            ("tools", "update_email", "parameters", "properties", "email", key),
            line="email: {",
        )
        for name, (schema, key) in {
            "on_a_number": ("type: number, x-endorsed: true", "x-endorsed"),
            "on_an_object": ("type: object, x-endorsed: true", "x-endorsed"),
            "untyped": ("x-endorsed: true", "x-endorsed"),
            "links_on_an_integer": ("type: integer, x-endorsed: links", "x-endorsed"),
            "neither_true_nor_links": ("type: string, x-endorsed: urls", "x-endorsed"),
            "kind_without_it": ("type: string, x-endorsed-kind: payee", "x-endorsed-kind"),
            "kind_malformed": (
                "type: string, x-endorsed: true, x-endorsed-kind: Pay Ee",
                "x-endorsed-kind",
            ),
        }.items()
    },
    "x_endorsed_on_an_identity": Case(
        "tenant_id: {type: string, x-identity: tenant}",
        "tenant_id: {type: string, x-identity: tenant, x-endorsed: true}",
        ("tools", "update_email", "parameters", "properties", "tenant_id", "x-endorsed"),
        line="tenant_id:",
    ),
    "on_unendorsed_without_an_endorsed_argument": Case(
        "    impact: high\n",
        "    impact: high\n    on_unendorsed: deny\n",
        ("tools", "update_email", "on_unendorsed"),
        line="on_unendorsed",
    ),
    "on_unendorsed_approve_without_approvers": Case(
        '        order_id: {type: string, pattern: "^ord_[A-Za-z0-9]+$", x-resource: order}\n'
        "    result: {fields: [id, status]}\n",
        '        order_id: {type: string, pattern: "^ord_[A-Za-z0-9]+$", x-resource: order,'
        " x-endorsed: true}\n    on_unendorsed: approve\n    result: {fields: [id, status]}\n",
        ("tools", "get_order", "on_unendorsed"),
        line="on_unendorsed",
    ),
    "a_read_approved_without_endorsed_arguments": Case(
        "    access: {roles: [support, customer]}\n",
        "    access: {roles: [support, customer]}\n    approval: {approvers: [actor], ttl_s: 61}\n",
        ("tools", "get_order", "approval"),
        line="ttl_s: 61",
    ),
    "x_resource_in_defs": Case(
        "    parameters:\n      type: object\n      additionalProperties: false\n"
        "      required: [customer_id, email]\n",
        "    parameters:\n      type: object\n      additionalProperties: false\n"
        "      required: [customer_id, email]\n"
        "      $defs: {id: {type: string, x-resource: order, title: hidden}}\n",
        ("tools", "update_email", "parameters", "$defs"),
        line="hidden",
    ),
    "x_resource_on_the_schema_itself": Case(
        "    parameters:\n      type: object\n      additionalProperties: false\n"
        "      required: [customer_id, email]\n",
        "    parameters:\n      type: object\n      x-resource: order\n"
        "      additionalProperties: false\n      required: [customer_id, email]\n",
        ("tools", "update_email", "parameters"),
        line="      x-resource: order",
    ),
    **{
        f"path_{name}": Case(
            'execute: {method: GET, path: "/orders/{order_id}"}',
            f'execute: {{method: GET, path: "{path}"}}',
            ("tools", "get_order", "execute", "path"),
            line=f'path: "{path}"',
        )
        for name, path in {
            "placeholder_inside_a_segment": "/orders/ord-{order_id}",
            "placeholder_with_a_suffix": "/orders/{order_id}.json",
            "two_placeholders_in_one_segment": "/orders/{order_id}{order_id}",
            "dot_segment": "/orders/./{order_id}",
            "dot_dot_segment": "/v1/../orders/{order_id}",
            "space": "/orders/all of/{order_id}",
            "query": "/orders/{order_id}?expand=1",
            "fragment": "/orders/{order_id}#x",
            "backslash": "/orders\\\\{order_id}",
            "bad_escape": "/orders/%zz/{order_id}",
            "non_ascii": "/bestellungen/\u00fc/{order_id}",
        }.items()
    },
    "dot_dot_segment_in_an_owner_path": Case(
        'owner: {method: GET, path: "/orders/{id}/owner"}',
        'owner: {method: GET, path: "/orders/{id}/../owner"}',
        ("resources", "order", "owner", "path"),
        line="/orders/{id}/../owner",
    ),
    **{
        f"base_url_{name}": Case(
            'base_url: "http://127.0.0.1:9"',
            f'base_url: "{url}"',
            ("providers", "billing", "base_url"),
            line=f'base_url: "{url}"',
        )
        for name, url in {
            "dot_dot_segment": "http://127.0.0.1:9/v1/../admin",
            "space": "http://127.0.0.1:9/my api",
            "non_ascii": "http://127.0.0.1:9/\u00fc",
            "unclosed_ipv6_host": "http://[::1/v1",
            "port_out_of_range": "http://127.0.0.1:99999",
            "port_not_a_number": "http://127.0.0.1:x",
            "backslash_in_host": "http://h\\\\x:9",
            "space_in_host": "http://my host:9",
        }.items()
    },
    # A name every tool-calling format accepts (OpenAI's and Anthropic's rule is the
    # narrowest): one that /catalog would list for a model API to refuse is refused here.
    **{
        f"tool_name_{name}": Case(
            "  get_order:\n",
            f'  "{tool}":\n',
            ("tools", tool),
            within=f'  "{tool}":',
        )
        for name, tool in {
            "with_a_dot": "orders.get",
            "with_a_space": "get order",
            "non_ascii": "get_\u00f6rder",
            "empty": "",
            "longer_than_64": "g" * 65,
        }.items()
    },
}


# A value YAML writes as another type is not read as the one meant: pydantic's lax mode
# would take ``true`` for 1, ``"false"`` for false and ``"2"`` for 2.
CASES.update(
    {
        f"{name}_of_another_type": Case(old, new, path, line=new.strip().split("\n")[0])
        for name, old, new, path in [
            (
                "ttl_s",
                "ttl_s: 300}",
                "ttl_s: true}",
                ("tools", "issue_refund", "approval", "ttl_s"),
            ),
            (
                "quorum",
                "ttl_s: 300}",
                "ttl_s: 300, quorum: true}",
                ("tools", "issue_refund", "approval", "quorum"),
            ),
            (
                "mutation",
                "    mutation: false\n    provider: billing\n    execute: {method: GET",
                '    mutation: "true"\n    provider: billing\n    execute: {method: GET',
                ("tools", "get_order", "mutation"),
            ),
            (
                "timeout_s",
                "timeout_s: 2}",
                'timeout_s: "2"}',
                ("providers", "billing", "timeout_s"),
            ),
        ]
    }
)


@pytest.mark.parametrize("name", list(CASES))
def test_check_refuses_and_locates_the_problem(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    text = edit(BASE, case.old, case.new)
    path = write(tmp_path, text)
    problems = problems_of(path)
    problem = at(problems, case.path)
    assert len(problems) == 1, [str(p) for p in problems]
    assert problem.file == str(path)
    if case.line is not None:
        assert problem.line == line_of(text, case.line), str(problem)
    else:
        assert case.within is not None
        assert problem.line in block_of(text, case.within), str(problem)


@pytest.mark.parametrize("kind", ["string", "integer"])
def test_a_resource_id_may_be_a_string_or_an_integer(tmp_path: Path, kind: str) -> None:
    text = edit(
        BASE,
        'order_id: {type: string, pattern: "^ord_[A-Za-z0-9]+$", x-resource: order}',
        f"order_id: {{type: {kind}, x-resource: order}}",
    )
    tool = load(write(tmp_path, text), {}).tools["get_order"]
    assert [arg for arg, _ in tool.resource_args] == ["order_id"]


def test_path_arguments_are_placeholders_and_owner_looked_up_ids(tmp_path: Path) -> None:
    text = edit(
        BASE,
        "dry_run: {method: POST, path: /refunds/preview}",
        'dry_run: {method: POST, path: "/refunds/{customer_id}/preview"}',
    )
    tools = load(write(tmp_path, text), {}).tools
    assert tools["get_order"].path_args == {"order_id"}
    assert tools["issue_refund"].path_args == {"order_id", "customer_id"}
    assert tools["update_email"].path_args == {"customer_id"}


def test_max_response_bytes_defaults_to_1_mib_and_is_kept_per_provider(tmp_path: Path) -> None:
    default = load(write(tmp_path, BASE), {})
    assert default.tools["get_order"].provider.max_response_bytes == 1 << 20
    text = edit(BASE, "timeout_s: 2}", "timeout_s: 2, max_response_bytes: 4096}")
    limited = load(write(tmp_path, text), {})
    assert limited.tools["get_order"].provider.max_response_bytes == 4096


def test_a_header_whose_env_value_ends_in_a_newline_is_a_problem_not_a_failing_call(
    tmp_path: Path,
) -> None:
    """A secret mounted from a file often ends in a newline. Sent, it would be refused by
    the HTTP client on every call, after a mutation's key was claimed and its approval
    consumed; it is refused where the catalog is loaded instead."""
    text = edit(BASE, "timeout_s: 2}", 'timeout_s: 2, headers: {X-Api-Key: "${KEY}"}}')
    path = write(tmp_path, text)
    with pytest.raises(CatalogError) as caught:
        load(path, {"KEY": "s3cret\n"})
    assert [p.path for p in caught.value.problems] == [
        ("providers", "billing", "headers", "X-Api-Key")
    ]
    assert "s3cret" not in str(caught.value.problems[0])
    assert load(path, {"KEY": "s3cret"}).tools["get_order"].provider.headers == {
        "X-Api-Key": "s3cret"
    }


def test_env_references_resolve_from_the_given_environment(tmp_path: Path) -> None:
    text = edit(BASE, 'base_url: "http://127.0.0.1:9"', 'base_url: "${TOOLGATE_TEST_URL}/v1"')
    text = edit(
        text,
        "timeout_s: 2}",
        'timeout_s: 2, headers: {X-Api-Key: "${TOOLGATE_TEST_KEY:-dev-key}"}}',
    )
    catalog = load(write(tmp_path, text), {"TOOLGATE_TEST_URL": "http://127.0.0.1:9101"})
    provider = catalog.tools["get_order"].provider
    assert provider.base_url == "http://127.0.0.1:9101/v1"
    assert provider.headers == {"X-Api-Key": "dev-key"}


def test_cel_comprehension_variables_are_not_foreign_variables(tmp_path: Path) -> None:
    """``exists(r, …)`` binds ``r`` inside the macro; it references only ``principal``."""
    text = edit(
        BASE,
        'high_impact_when: "args.amount > 100.0"',
        "high_impact_when: \"args.amount > 100.0 || principal.roles.exists(r, r == 'intern')\"",
    )
    catalog = load(write(tmp_path, text), {})
    assert catalog.tools["issue_refund"].high_impact_when is not None


def test_several_problems_in_one_file_are_all_reported_at_once(tmp_path: Path) -> None:
    text = BASE
    for old, new in (
        (
            "    mutation: false\n    provider: billing\n",
            "    mutation: false\n    provider: ups\n",
        ),
        ('high_impact_when: "args.amount > 100.0"', 'high_impact_when: "args.amount >"'),
        ("    dry_run: {method: POST, path: /refunds/preview}\n", ""),
        ("customer_id: {type: string, x-identity: user}", "customer_id: {type: string, x-id: 1}"),
        (
            'execute: {method: PATCH, path: "/customers/{customer_id}"}',
            'execute: {method: PATCH, path: "/c/{cid}"}',
        ),
        ('base_url: "http://127.0.0.1:9"', 'base_url: "${TOOLGATE_TEST_UNSET}"'),
    ):
        text = edit(text, old, new)
    path = write(tmp_path, text)
    problems = problems_of(path)
    expected = {
        ("tools", "get_order", "provider"): "provider: ups",
        ("tools", "issue_refund", "high_impact_when"): 'high_impact_when: "args.amount >"',
        ("tools", "issue_refund", "require_dry_run"): "require_dry_run: true",
        ("tools", "issue_refund", "parameters"): "x-id: 1",
        ("tools", "update_email", "execute", "path"): 'path: "/c/{cid}"',
        ("providers", "billing"): "${TOOLGATE_TEST_UNSET}",
    }
    for where, needle in expected.items():
        problem = at(problems, where)
        assert (problem.file, problem.line) == (str(path), line_of(text, needle)), str(problem)


def test_a_shape_error_in_one_tool_does_not_hide_problems_elsewhere(tmp_path: Path) -> None:
    """``check`` prints *every* problem, so one round of fixes is enough."""
    text = edit(
        BASE,
        "    result: {fields: [id, status]}\n",
        "    result: {fields: [id, status]}\n    colour: blue\n",
    )
    text = edit(
        text, 'high_impact_when: "args.amount > 100.0"', 'high_impact_when: "args.amount >"'
    )
    problems = problems_of(write(tmp_path, text))
    assert at(problems, ("tools", "get_order", "colour")).line == line_of(text, "colour: blue")
    assert at(problems, ("tools", "issue_refund", "high_impact_when")).line == line_of(
        text, 'high_impact_when: "args.amount >"'
    )


# A misspelt key, at each kind of place a catalog has keys: the edit, where, what was meant.
MISSPELT: dict[str, tuple[str, str, tuple[str | int, ...], str]] = {
    "tool_key": (
        "require_dry_run: true",
        "requires_dry_run: true",
        ("tools", "issue_refund", "requires_dry_run"),
        "require_dry_run",
    ),
    "result_key": (
        "result: {fields: [id, status]}",
        "result: {feilds: [id, status]}",
        ("tools", "get_order", "result", "feilds"),
        "fields",
    ),
    "approval_key": (
        '"role:support_lead"]}',
        '"role:support_lead"], ttl: 60}',
        ("tools", "update_email", "approval", "ttl"),
        "ttl_s",
    ),
    "endpoint_key": (
        "dry_run: {method: POST, path: /refunds/preview}",
        "dry_run: {method: POST, paht: /refunds/preview}",
        ("tools", "issue_refund", "dry_run", "paht"),
        "path",
    ),
    "provider_key": (
        "timeout_s: 2}",
        "timeout: 2}",
        ("providers", "billing", "timeout"),
        "timeout_s",
    ),
    "top_level_key": (
        'version: "t1"\n',
        'version: "t1"\nresource: {}\n',
        ("resource",),
        "resources",
    ),
    "notify_entry_key": (
        'version: "t1"\n',
        'version: "t1"\nnotify: [{url: "http://127.0.0.1:9", events: [run.ended], secret: S}]\n',
        ("notify", 0, "secret"),
        "secret_env",
    ),
}


@pytest.mark.parametrize("name", list(MISSPELT))
def test_a_misspelt_key_is_answered_with_the_key_meant_and_its_place(
    name: str, tmp_path: Path
) -> None:
    old, new, where, meant = MISSPELT[name]
    text = edit(BASE, old, new)
    path = write(tmp_path, text)
    problems = problems_of(path)
    problem = at(problems, where)
    assert problem.message == f"unknown key: did you mean {meant}?", str(problem)
    assert (problem.file, problem.line) == (str(path), line_of(text, new.strip().split("\n")[-1]))
    assert str(problem) == (
        f"{path}:{problem.line}: {'.'.join(map(str, where))}: unknown key: did you mean {meant}?"
    )


def test_a_key_like_no_allowed_one_is_answered_with_the_keys_allowed_there(
    tmp_path: Path,
) -> None:
    text = edit(BASE, "result: {fields: [id, status]}", "result: {colour: blue}")
    problem = at(problems_of(write(tmp_path, text)), ("tools", "get_order", "result", "colour"))
    assert problem.message == "unknown key: allowed here are fields, error_fields, redact, trusted"


# --- directories and policy_version ----------------------------------------------------------


def split_base() -> tuple[str, str]:
    """BASE as two files: header + get_order, and a ``tools:`` file with the other two."""
    cut = BASE.index("  issue_refund:\n")
    return BASE[:cut], "tools:\n" + BASE[cut:]


def test_a_directory_of_yaml_files_is_merged(tmp_path: Path) -> None:
    first, second = split_base()
    directory = tmp_path / "catalog"
    directory.mkdir()
    write(directory, first, "10-base.yaml")
    write(directory, second, "20-mutations.yaml")
    (directory / "notes.txt").write_text("not: [yaml")
    merged = load(directory, {})
    single = load(write(tmp_path, BASE, "single.yaml"), {})
    assert set(merged.tools) == {"get_order", "issue_refund", "update_email"}
    assert merged.policy_version == single.policy_version


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_yaml_name_that_is_no_regular_file_is_a_problem_not_a_hang(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO named ``*.yaml`` in the catalog directory blocked the load (serve's start,
    every reload, ``catalog check``) until something wrote to it; a link to ``/dev/zero``
    read without end."""
    directory = tmp_path / "catalog"
    directory.mkdir()
    write(directory, BASE, "10-base.yaml")
    odd = directory / "20-odd.yaml"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero")
    with pytest.raises(CatalogError) as caught:
        load(directory, {})
    assert [str(p) for p in caught.value.problems] == [f"{odd}: unreadable: not a regular file"]


def test_the_same_tool_in_two_files_is_a_problem(tmp_path: Path) -> None:
    first, second = split_base()
    get_order = BASE[BASE.index("  get_order:\n") : BASE.index("  issue_refund:\n")]
    second = second + get_order
    write(tmp_path, first, "10-base.yaml")
    duplicate = write(tmp_path, second, "20-mutations.yaml")
    problems = problems_of(tmp_path)
    problem = at(problems, ("tools", "get_order"))
    assert problem.file == str(duplicate)
    assert problem.line in block_of(second, "  get_order:"), str(problem)


def policy_version(tmp_path: Path, text: str, name: str) -> str:
    return load(write(tmp_path, text, name), {}).policy_version


def test_policy_version_is_the_label_and_a_short_content_hash(tmp_path: Path) -> None:
    version = policy_version(tmp_path, BASE, "a.yaml")
    assert re.fullmatch(r"t1#[0-9a-f]{6}", version), version
    relabelled = policy_version(tmp_path, edit(BASE, 'version: "t1"', 'version: "t2"'), "b.yaml")
    assert relabelled.startswith("t2#")


def test_policy_version_changes_when_a_tool_changes(tmp_path: Path) -> None:
    version = policy_version(tmp_path, BASE, "a.yaml")
    for i, (old, new) in enumerate(
        (
            ("maximum: 5000", "maximum: 5001"),
            ("ttl_s: 300}", "ttl_s: 301}"),
            ("access: {roles: [support, customer]}", "access: {roles: [support]}"),
            ("    mutation: false\n", "    description: Look up an order.\n    mutation: false\n"),
        )
    ):
        changed = policy_version(tmp_path, edit(BASE, old, new), f"changed{i}.yaml")
        assert changed.startswith("t1#")
        assert changed != version, (old, new)


def test_policy_version_ignores_comments_and_whitespace(tmp_path: Path) -> None:
    version = policy_version(tmp_path, BASE, "a.yaml")
    reformatted = "# toolgate test catalog\n\n" + BASE.replace(
        "tools:\n", "\n# --- tools ---\ntools:\n\n"
    ).replace("maximum: 5000}", "maximum: 5000 }   # upper bound").replace(
        "access: {roles: [support, customer]}",
        "access:\n      roles:\n        - support   # staff\n        - customer",
    )
    assert reformatted != BASE
    assert policy_version(tmp_path, reformatted, "b.yaml") == version


def test_a_key_twice_in_one_mapping_is_a_problem_not_the_last_one_winning(tmp_path: Path) -> None:
    """Within one file too: a second ``access`` that drops the roles, or a second tool of
    one name, would otherwise replace the first without a word."""
    text = edit(
        BASE,
        "    access: {roles: [support, customer]}\n",
        "    access: {roles: [support, customer]}\n    access: {}\n",
    )
    problems = problems_of(write(tmp_path, text))
    problem = at(problems, ("tools", "get_order", "access"))
    assert (problem.message, problem.line) == (
        "defined more than once",
        line_of(text, "access: {}"),
    )
    twice = BASE + BASE[BASE.index("  get_order:\n") : BASE.index("  issue_refund:\n")]
    assert at(problems_of(write(tmp_path, twice, "twice.yaml")), ("tools", "get_order"))


def test_aliases_that_expand_past_the_bound_are_refused_before_memory_runs_out(
    tmp_path: Path,
) -> None:
    """A "billion laughs": 360 bytes that would expand to 10**8 values."""
    levels = ['l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]'] + [
        f"l{n}: &l{n} [" + ",".join([f"*l{n - 1}"] * 10) + "]" for n in range(1, 8)
    ]
    bomb = write(tmp_path, "\n".join(levels) + "\n", "bomb.yaml")
    started = time.monotonic()
    problems = problems_of(bomb)
    assert time.monotonic() - started < 5
    assert [p.message for p in problems] == [
        "expands to more than 100,000 values (aliases count each time used)"
    ]


@pytest.mark.parametrize("depth", [900, 5000, 50_000])
def test_a_file_nested_too_deeply_is_a_problem_not_a_crash(tmp_path: Path, depth: int) -> None:
    deep = write(tmp_path, "version: x\nnested: " + "[" * depth + "]" * depth + "\n", "deep.yaml")
    assert [p.message for p in problems_of(deep)] == ["nested too deeply"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("&p {type: object, properties: {a: *p}}", "an alias inside itself"),
        (
            "{type: object, properties: {n: {type: integer, maximum: 100000000000000000000}}}",
            "an integer beyond ±(2**53 - 1): JSON cannot say it",
        ),
        ("{type: object, description: !!binary aGVsbG8=}", "not a JSON value (YAML made a bytes)"),
        ("{type: object, description: 2026-12-01}", "not a JSON value (YAML made a date)"),
        ("{type: object, properties: {n: {type: number, maximum: .inf}}}", "not a finite number"),
    ],
)
def test_values_json_cannot_hold_are_located_problems(
    tmp_path: Path, value: str, message: str
) -> None:
    text = BASE + f"  odd_tool:\n    mutation: false\n    parameters: {value}\n"
    problems = problems_of(write(tmp_path, text))
    assert message in [p.message for p in problems], [str(p) for p in problems]
    assert all(p.line == line_of(text, "parameters: ") for p in problems if p.message == message)


@pytest.mark.parametrize(
    "order", [("10-base.yaml", "20-empty.yaml"), ("20-base.yaml", "10-empty.yaml")]
)
def test_an_empty_section_in_one_file_neither_erases_nor_breaks_another_files(
    tmp_path: Path, order: tuple[str, str]
) -> None:
    """``tools:`` left empty in one file of a directory (a template, a file being written):
    read after the file defining the tools, it would silently drop them all; read before,
    the load crashed instead of listing problems."""
    full, empty = order
    write(tmp_path, BASE, full)
    write(tmp_path, "providers:\nresources:\ntools:\n", empty)
    merged = load(tmp_path, {})
    assert set(merged.tools) == {"get_order", "issue_refund", "update_email"}


def test_a_section_that_is_not_a_mapping_is_a_located_problem_in_any_file(tmp_path: Path) -> None:
    write(tmp_path, BASE, "10-base.yaml")
    second = write(tmp_path, "tools: [get_order]\n", "20-list.yaml")
    problem = at(problems_of(tmp_path), ("tools",))
    assert (problem.file, problem.line, problem.message) == (
        str(second),
        1,
        "must be a mapping of names to entries",
    )


@pytest.mark.parametrize("key", ["on", "no", "~", "null", "0x10", "010", "1_000", "1.50", "12"])
def test_a_key_yaml_reads_as_no_text_is_a_problem_not_a_renamed_one(
    tmp_path: Path, key: str
) -> None:
    """YAML 1.1 reads ``on`` as true and ``~`` as null, ``0x10`` as 16: such a key became
    "True", "None" or "16": an ``x-sensitive`` argument named ``on`` was masked under a
    name models never send (where the schema admits other names, the one they do send
    reached the audit trail unmasked), and a tool, provider or header could be defined
    under a name nobody wrote."""
    text = edit(
        BASE,
        "        note: {type: string, maxLength: 500, x-sensitive: true}\n",
        f"        {key}: {{type: string, maxLength: 500, x-sensitive: true}}\n",
    )
    problem = at(problems_of(write(tmp_path, text)), ("tools", "issue_refund", "parameters"))
    assert problem.message == "a key must be text: quote it"
    assert problem.line == line_of(text, f"        {key}: ")


def test_a_quoted_key_is_the_text_it_spells(tmp_path: Path) -> None:
    text = edit(
        BASE,
        "        note: {type: string, maxLength: 500, x-sensitive: true}\n",
        "        'on': {type: string, maxLength: 500, x-sensitive: true}\n",
    )
    assert load(write(tmp_path, text), {}).tools["issue_refund"].sensitive_args == {"on"}


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server that hands out a JSON Schema, and the paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("amount: {type: number,", 'amount: {$ref: "{server}/amount.json", type: number,'),
        ("amount: {type: number,", 'amount: {$ref: "file://{file}", type: number,'),
        (
            "      required: [order_id, amount, customer_id]\n",
            '      $schema: "{server}/draft/2020-12/schema"\n'
            "      required: [order_id, amount, customer_id]\n",
        ),
    ],
)
def test_a_schema_that_refers_outside_the_catalog_is_refused_and_nothing_is_fetched(
    tmp_path: Path, schema_server: tuple[str, list[str]], old: str, new: str
) -> None:
    """A ``$ref`` (or ``$schema``) naming a URL or a file was fetched at every load: the
    arguments a tool accepts then depended on a document outside the catalog, which whoever
    controls that host or file could change without the policy version changing, and
    ``toolgate check`` sent requests (or read files) of the catalog's choosing."""
    url, asked = schema_server
    elsewhere = write(tmp_path, '{"type": "string"}', "amount.json")
    text = edit(BASE, old, new.replace("{server}", url).replace("{file}", str(elsewhere)))
    problems = problems_of(write(tmp_path, text))
    assert at(problems, ("tools", "issue_refund", "parameters"))
    assert asked == []


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ("args.reasn.size() > 3", "args.reasn"),
        ("has(args.amout) && args.amount > 1.0", "args.amout"),
        ("args['amont'] > 100.0", "args.amont"),
        ("args.amount > 100.0 || principal.role == 'intern'", "principal.role"),
    ],
)
def test_cel_naming_an_argument_or_principal_field_that_does_not_exist_is_refused(
    tmp_path: Path, expression: str, named: str
) -> None:
    """A misspelt argument name compiles, and then every call fails to evaluate, which
    fails closed: every call silently needs an approval. Check refuses it instead."""
    text = edit(
        BASE, 'high_impact_when: "args.amount > 100.0"', f'high_impact_when: "{expression}"'
    )
    with pytest.raises(CatalogError) as refused:
        load(write(tmp_path, text), {})
    assert f"CEL names {named}, which a call does not have" in str(refused.value)


def test_cel_may_name_declared_arguments_in_any_form_and_mention_others_in_strings(
    tmp_path: Path,
) -> None:
    expression = "args['amount'] > 100.0 || (has(args.order_id) && args.order_id == 'args.x')"
    text = edit(
        BASE, 'high_impact_when: "args.amount > 100.0"', f'high_impact_when: "{expression}"'
    )
    assert load(write(tmp_path, text), {}).tools["issue_refund"].high_impact_when is not None


@pytest.mark.parametrize(
    ("summary", "message"),
    [
        ("[amount, amout]", "'amout' is not a top-level parameter"),
        ("[note]", "'note' is x-sensitive: the inbox never shows its value"),
    ],
)
def test_an_approval_summary_names_parameters_the_inbox_may_show(
    tmp_path: Path, summary: str, message: str
) -> None:
    text = BASE.replace("ttl_s: 300}", f"ttl_s: 300, summary: {summary}}}", 1)
    assert text != BASE
    with pytest.raises(CatalogError) as refused:
        load(write(tmp_path, text), {})
    assert message in str(refused.value)


def test_owner_among_approvers_still_means_the_actor_and_is_pointed_out(tmp_path: Path) -> None:
    """``owner`` read as the record's owner of ``access.owner``; ``actor`` says what it
    means, and catalogs that still write ``owner`` keep working."""
    catalog = load(write(tmp_path, BASE.replace("approvers: [actor,", "approvers: [owner,")), {})
    approval = catalog.tools["issue_refund"].approval
    assert approval is not None
    assert approval.approvers == ["actor", "role:finance_approver"]
    assert [w.split(": ", 2)[1] for w in catalog.warnings] == [
        "tools.issue_refund.approval.approvers.0",
        "tools.issue_refund.approval.approvers",
    ]
    problems = problems_of(write(tmp_path, BASE.replace("approvers: [actor,", "approvers: [me,")))
    assert "approvers are 'actor' or 'role:<name>'" in str(problems[0])


@pytest.mark.parametrize(
    ("old", "new", "warned"),
    [
        ("", "", True),  # high impact over 100.00, and its actor may approve it
        ("approvers: [actor, ", "approvers: [", False),  # a second person decides
        ('    high_impact_when: "args.amount > 100.0"\n', "    on_taint: approve\n", False),
    ],
)
def test_a_high_impact_tool_its_own_actor_may_approve_is_pointed_out(
    tmp_path: Path, old: str, new: str, warned: bool
) -> None:
    """Letting the actor approve is a choice for a call the user confirms (a tainted
    transfer of their own), not for one a rule calls high impact."""
    catalog = load(write(tmp_path, edit(BASE, old, new) if old else BASE), {})
    assert any("their own high-impact call" in w for w in catalog.warnings) is warned


def test_a_quorum_is_of_other_people_than_the_actor(tmp_path: Path) -> None:
    quorum = BASE.replace("ttl_s: 300}", "ttl_s: 300, quorum: 2}", 1)
    problems = problems_of(write(tmp_path, quorum))
    assert at(problems, ("tools", "issue_refund", "approval", "quorum")).message.startswith(
        "a quorum is of people other than the call's actor"
    )
    roles_only = quorum.replace("approvers: [actor, ", "approvers: [")
    approval = load(write(tmp_path, roles_only), {}).tools["issue_refund"].approval
    assert approval is not None
    assert approval.quorum == 2
    assert problems_of(write(tmp_path, roles_only.replace("quorum: 2", "quorum: 0")))


def test_an_x_keyword_toolgate_does_not_know_is_refused_so_no_listed_schema_carries_one(
    tmp_path: Path,
) -> None:
    """MCP's ``x-mcp-header`` asks clients to mirror an argument into a header the SDK then
    checks; toolgate lists schemas without any ``x-`` keyword and tells the SDK there is
    nothing to check (``app.mcp.server.no_header_to_check``), which holds because a
    catalog cannot declare one."""
    text = edit(
        BASE,
        "amount: {type: number",
        "amount: {x-mcp-header: Amount, type: number",
    )
    with pytest.raises(CatalogError) as refused:
        load(write(tmp_path, text), {})
    assert "x-mcp-header" in str(refused.value)


# --- x-endorsed on optional, nullable and list arguments ------------------------------------

EMAIL = "        email: {type: string}\n"
ENDORSED_EMAIL = ("tools", "update_email", "parameters", "properties", "email", "x-endorsed")


@pytest.mark.parametrize(
    ("schema", "mode", "many"),
    [
        ("type: string, x-endorsed: true", "value", False),
        ('type: [string, "null"], x-endorsed: true', "value", False),
        ('type: ["null", integer], x-endorsed: true', "value", False),
        (
            'anyOf: [{type: string, format: email}, {type: "null"}], x-endorsed: true',
            "value",
            False,
        ),
        ('type: [string, "null"], x-endorsed: links', "links", False),
        ("type: array, items: {type: string, format: email}, x-endorsed: true", "value", True),
        ("type: array, items: {type: integer}, maxItems: 20, x-endorsed: true", "value", True),
        ('type: array, items: {type: [string, "null"]}, x-endorsed: true', "value", True),
        ('type: [array, "null"], items: {type: string}, x-endorsed: links', "links", True),
        (
            'anyOf: [{type: array, items: {type: string}}, {type: "null"}], x-endorsed: true',
            "value",
            True,
        ),
    ],
)
def test_x_endorsed_holds_on_a_nullable_value_and_on_a_list_of_values_judged_each(
    tmp_path: Path, schema: str, mode: EndorsedMode, many: bool
) -> None:
    """``many``: the argument is a list, and each of its items is judged on its own."""
    text = edit(BASE, EMAIL, f"        email: {{{schema}}}\n")
    endorsed = load(write(tmp_path, text), {}).tools["update_email"].endorsed_args
    assert endorsed == (Endorsed("email", mode, "update_email.email", many),)


def test_x_endorsed_holds_on_an_optional_argument_and_its_kind_names_each_items_kind(
    tmp_path: Path,
) -> None:
    optional = (
        "        cc: {type: array, items: {type: string}, x-endorsed: true, x-endorsed-kind: m}\n"
    )
    tool = load(write(tmp_path, edit(BASE, EMAIL, EMAIL + optional)), {}).tools["update_email"]
    assert "cc" not in tool.parameters["required"]
    assert tool.endorsed_args == (Endorsed("cc", "value", "m", many=True),)


VALUE_NEEDS = (
    'x-endorsed needs type: string or integer, which may be nullable (type: [string, "null"],'
    ' or anyOf: [{type: string}, {type: "null"}]), or an array of such items'
)
LINKS_NEED = (
    'x-endorsed: links needs type: string, which may be nullable (type: [string, "null"],'
    ' or anyOf: [{type: string}, {type: "null"}]), or an array of such items'
)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("type: object, x-endorsed: true", VALUE_NEEDS),
        ("type: boolean, x-endorsed: true", VALUE_NEEDS),
        ("type: number, x-endorsed: true", VALUE_NEEDS),
        ('type: "null", x-endorsed: true', VALUE_NEEDS),
        ("x-endorsed: true", VALUE_NEEDS),
        ("type: [string, integer], x-endorsed: true", VALUE_NEEDS),
        ("anyOf: [{type: string}, {type: integer}], x-endorsed: true", VALUE_NEEDS),
        ('anyOf: [{type: object}, {type: "null"}], x-endorsed: true', VALUE_NEEDS),
        ("allOf: [{type: string}], x-endorsed: true", VALUE_NEEDS),
        ("type: array, x-endorsed: true", VALUE_NEEDS),
        ("type: array, items: {type: number}, x-endorsed: true", VALUE_NEEDS),
        ("type: array, items: {type: object}, x-endorsed: true", VALUE_NEEDS),
        ("type: array, items: {type: array, items: {type: string}}, x-endorsed: true", VALUE_NEEDS),
        (
            "type: array, prefixItems: [{type: object}], items: {type: string}, x-endorsed: true",
            VALUE_NEEDS,
        ),
        ("type: integer, x-endorsed: links", LINKS_NEED),
        ('type: [integer, "null"], x-endorsed: links', LINKS_NEED),
        ("type: array, items: {type: integer}, x-endorsed: links", LINKS_NEED),
        ('oneOf: [{type: "null"}, {type: integer}], x-endorsed: links', LINKS_NEED),
        ("type: string, x-endorsed: urls", "x-endorsed is true or 'links'"),
        (
            "type: string, x-endorsed: false, x-endorsed-kind: payee",
            "x-endorsed-kind needs x-endorsed",
        ),
    ],
)
def test_check_refuses_x_endorsed_on_what_is_not_text_or_an_integer_each(
    tmp_path: Path, schema: str, message: str
) -> None:
    text = edit(BASE, EMAIL, f"        email: {{{schema}}}\n")
    problems = problems_of(write(tmp_path, text))
    assert len(problems) == 1, [str(p) for p in problems]
    assert problems[0].path[:-1] == ENDORSED_EMAIL[:-1]
    assert problems[0].message == message
    assert problems[0].line == line_of(text, "email: {")


def test_check_refuses_x_endorsed_on_an_identity_whatever_its_type(tmp_path: Path) -> None:
    old = "tenant_id: {type: string, x-identity: tenant}"
    for schema in ("type: string", 'type: [string, "null"]'):
        text = edit(BASE, old, f"tenant_id: {{{schema}, x-identity: tenant, x-endorsed: true}}")
        problem = at(problems_of(write(tmp_path, text)), (*ENDORSED_EMAIL[:4], "tenant_id"))
        assert problem.message == (
            "an x-identity argument is always the session's own: it needs no endorsement"
        )
