"""The catalog's JSON Schema (``toolgate catalog-schema``, committed as
``docs/catalog.schema.json``): editors validate catalogs with it, so it must be the command's
output, accept every catalog the repository ships, and refuse what ``toolgate check``
refuses for its shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml

from app.catalog.loader import CatalogError, load
from tests.catalogs import BASE, write
from tests.conftest import ROOT

COMMITTED = ROOT / "docs" / "catalog.schema.json"


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(COMMITTED.read_text())
    return loaded


def validator() -> jsonschema_rs.Draft202012Validator:
    return jsonschema_rs.Draft202012Validator(schema())


def shipped_catalogs() -> dict[str, str]:
    """Every catalog the repository ships or tests with, as YAML text."""
    configmap = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "catalog.yaml").read_text())
    return {
        "demo": (ROOT / "catalog" / "demo.yaml").read_text(),
        "tests": BASE,
        "kubernetes": configmap["data"]["catalog.yaml"],
        "agentdojo replay": (ROOT / "bench" / "agentdojo_banking.yaml").read_text(),
    }


def test_each_file_of_a_catalog_directory_is_valid_on_its_own(tmp_path: Path) -> None:
    """Only one file of a directory needs ``version``; the schema checks files one by one."""
    cut = BASE.index("  issue_refund:\n")
    files = {"10-base.yaml": BASE[:cut], "20-mutations.yaml": "tools:\n" + BASE[cut:]}
    for name, text in files.items():
        assert [e.message for e in validator().iter_errors(yaml.safe_load(text))] == [], name
        write(tmp_path, text, name)
    assert set(load(tmp_path, {}).tools) == {"get_order", "issue_refund", "update_email"}


def test_the_committed_schema_is_what_the_command_prints() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "catalog-schema"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == COMMITTED.read_text(), "run: toolgate catalog-schema > " + str(
        COMMITTED.relative_to(ROOT)
    )


def test_the_schema_is_a_valid_2020_12_schema() -> None:
    jsonschema_rs.meta.validate(schema())
    assert schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("name", sorted(shipped_catalogs()))
def test_every_shipped_catalog_is_valid_under_the_schema(name: str, tmp_path: Path) -> None:
    text = shipped_catalogs()[name]
    errors = [e.message for e in validator().iter_errors(yaml.safe_load(text))]
    assert errors == []
    load(write(tmp_path, text), {"DEMO_PROVIDERS_URL": "http://127.0.0.1:9100"})


# Each case puts something the file may not say at one place of the tests' catalog.
BAD_SHAPES = {
    "unknown top-level key": ("version: ", "owner: me\nversion: "),
    "unknown provider key": ("timeout_s: 2}", "timeout_s: 2, retries: 3}"),
    "unknown resource key": ("    owner: {", "    kind: x\n    owner: {"),
    "unknown endpoint key": ('/owner"}', '/owner", auth: none}'),
    "unknown tool key": ("    mutation: false\n", "    mutation: false\n    dangerous: no\n"),
    "unknown approval key": ("ttl_s: 300}", "ttl_s: 300, majority: 2}"),
    "unknown access key": ("roles: [support, customer]}", "roles: [support], teams: [a]}"),
    "unknown result key": ("fields: [id, status]}", "fields: [id], hide: [status]}"),
    "mutation not a boolean": ("    mutation: false\n", "    mutation: maybe\n"),
    "tool without parameters": (
        "tools:\n",
        "tools:\n  ping: {mutation: false, provider: billing, execute: {method: GET, path: /p}}\n",
    ),
    "unknown method": ('{method: GET, path: "/orders/{order_id}"}', '{method: FETCH, path: "/o"}'),
    "relative path": ("path: /refunds}", "path: refunds}"),
    "timeout of zero": ("timeout_s: 2}", "timeout_s: 0}"),
    "response limit too small": ("timeout_s: 2}", "timeout_s: 2, max_response_bytes: 10}"),
    "unknown impact": ("    impact: high\n", "    impact: medium\n"),
    "empty approvers": ('approvers: ["role:support_lead"]', "approvers: []"),
    "unknown access owner": ("access: {owner: user}", "access: {owner: team}"),
    "negative cost": ("roles: [support], owner: tenant}\n", "roles: [support]}\n    cost: -1\n"),
}


@pytest.mark.parametrize("case", sorted(BAD_SHAPES))
def test_a_catalog_check_refuses_for_its_shape_fails_the_schema_too(
    case: str, tmp_path: Path
) -> None:
    old, new = BAD_SHAPES[case]
    assert BASE.count(old) == 1, case
    text = BASE.replace(old, new)
    assert list(validator().iter_errors(yaml.safe_load(text))), case
    with pytest.raises(CatalogError):
        load(write(tmp_path, text), {})
