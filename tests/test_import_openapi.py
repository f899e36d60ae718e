"""``toolgate catalog import-openapi``: drafted entries that ``toolgate check`` accepts, with
what to review as comments, from two real documents of different styles; and refusals
that say why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.catalog.loader import load
from app.cli import main
from tests.conftest import ROOT

DOCUMENTS = ROOT / "tests" / "openapi"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["catalog", "import-openapi", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def checked(tmp_path: Path, text: str) -> Any:
    """The drafted file, loaded as ``toolgate check`` loads it (raises on any problem)."""
    path = tmp_path / "imported.yaml"
    path.write_text(text)
    return load(path, {})


def document(tmp_path: Path, paths: dict[str, Any], **extra: Any) -> str:
    spec = {
        "openapi": "3.0.3",
        "info": {"title": "Shop", "version": "2"},
        "servers": [{"url": "https://shop.example.com/api"}],
        "paths": paths,
        **extra,
    }
    path = tmp_path / "openapi.json"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_the_minimal_petstore_becomes_tools_check_accepts_with_suggestions(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = run(capsys, str(DOCUMENTS / "oai-petstore.yaml"), "--provider", "pets")
    assert status == 0, err
    catalog = checked(tmp_path, out)
    assert sorted(catalog.tools) == ["createPets", "listPets", "showPetById"]
    listing, one, create = (catalog.tools[n] for n in ("listPets", "showPetById", "createPets"))
    assert (listing.mutation, listing.impact) == (False, "read")
    assert listing.parameters["required"] == []
    assert listing.parameters["properties"]["limit"]["type"] == "integer"
    assert one.execute.path == "/pets/{petId}"
    assert one.parameters["required"] == ["petId"]
    assert (create.mutation, create.impact) == (True, "low")
    assert one.provider.base_url == "http://petstore.swagger.io/v1"
    lines = out.splitlines()
    at = lines.index(
        '        petId: {"type": "string", "description": "The id of the pet to retrieve"}'
    )
    assert lines[at - 1].startswith("        # suggestion: x-resource:")
    assert "# access: {roles: [...], owner: tenant}" in out
    assert "3 tools drafted, 0 operations skipped" in err


def test_a_document_of_refs_and_other_media_translates_what_toolgate_can_call(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = str(DOCUMENTS / "openapi-core-petstore.yaml")
    status, out, err = run(capsys, source, "--provider", "pets")
    assert status == 1
    assert "give --base-url" in err  # its server URL has variables
    status, out, err = run(capsys, source, "--provider", "pets", "--base-url", "https://p.test/v1")
    assert status == 0, err
    catalog = checked(tmp_path, out)
    assert sorted(catalog.tools) == [
        "createTag",
        "listPets",
        "listTags",
        "showPetById",
        "showPetPhotoById",
    ]
    tag = catalog.tools["createTag"].parameters
    assert tag["required"] == ["name"]  # from the $ref'd TagCreate schema
    assert "$ref" not in out
    limit = catalog.tools["listPets"].parameters["properties"]["limit"]
    assert limit["type"] == ["integer", "null"]  # nullable
    assert "skipped POST /pets: needs the header 'api-key', which toolgate never sends" in err
    assert "skipped POST /pets/{petId}/photo: a body that is not JSON (image/*)" in err
    assert "skipped DELETE /tags: a body on GET or DELETE" in err


def test_a_deletion_is_high_impact_and_a_body_becomes_the_arguments(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["email"],
                    "properties": {
                        "email": {"type": "string"},
                        "id": {"type": "string", "readOnly": True},
                        "password": {"type": "string"},
                    },
                }
            }
        },
    }
    spec = document(
        tmp_path,
        {
            "/orders/{order_id}": {
                "parameters": [
                    {
                        "name": "order_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
                "delete": {"operationId": "cancel_order"},
                "put": {"operationId": "update_order", "requestBody": body},
            },
            "/users": {"post": {"operationId": "create_user", "requestBody": body}},
        },
    )
    status, out, err = run(capsys, spec, "--provider", "shop")
    assert status == 0, err
    catalog = checked(tmp_path, out)
    cancel, user = catalog.tools["cancel_order"], catalog.tools["create_user"]
    assert (cancel.impact, cancel.approval.approvers) == ("high", ["actor"])
    assert cancel.execute.path == "/orders/{order_id}"
    assert user.parameters["required"] == ["email"]
    assert set(user.parameters["properties"]) == {"email", "password"}  # readOnly left out
    assert "# suggestion: x-sensitive: true" in out
    assert catalog.tools["update_order"].parameters["required"] == ["email", "order_id"]


@pytest.mark.parametrize(
    ("paths", "reason"),
    [
        (
            {
                "/a": {
                    "get": {
                        "operationId": "a",
                        "parameters": [
                            {"name": "q", "in": "query", "schema": {"$ref": "other.yaml#/Q"}}
                        ],
                    }
                }
            },
            "a reference toolgate cannot follow: 'other.yaml#/Q'",
        ),
        (
            {
                "/a": {
                    "post": {
                        "operationId": "a",
                        "parameters": [{"name": "q", "in": "query", "schema": {"type": "string"}}],
                        "requestBody": {
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {"b": {"type": "string"}},
                                    }
                                }
                            }
                        },
                    }
                }
            },
            "query parameters beside a body",
        ),
        (
            {
                "/files/{name}.json": {
                    "get": {
                        "operationId": "a",
                        "parameters": [
                            {
                                "name": "name",
                                "in": "path",
                                "required": True,
                                "schema": {"type": "string"},
                            }
                        ],
                    }
                }
            },
            "a path placeholder that is not a whole segment",
        ),
        (
            {
                "/a": {
                    "post": {
                        "operationId": "a",
                        "requestBody": {
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/Node"}
                                }
                            }
                        },
                    }
                }
            },
            "a schema nested too deeply, or recursive",
        ),
    ],
)
def test_what_toolgate_cannot_call_is_refused_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, paths: dict[str, Any], reason: str
) -> None:
    node = {"type": "object", "properties": {"child": {"$ref": "#/components/schemas/Node"}}}
    spec = document(tmp_path, paths, components={"schemas": {"Node": node}})
    status, out, err = run(capsys, spec, "--provider", "shop")
    assert (status, out) == (1, "")
    assert "no operation could be translated" in err
    assert reason in err


def test_swagger_2_and_an_existing_out_file_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old = tmp_path / "swagger.json"
    old.write_text('{"swagger": "2.0", "paths": {}}')
    status, _, err = run(capsys, str(old), "--provider", "shop")
    assert status == 1
    assert "not an OpenAPI 3.x document" in err
    taken = tmp_path / "catalog.yaml"
    taken.write_text("mine\n")
    status, _, err = run(
        capsys, str(DOCUMENTS / "oai-petstore.yaml"), "--provider", "pets", "--out", str(taken)
    )
    assert status == 1
    assert taken.read_text() == "mine\n"
    assert "File exists" in err


def test_a_title_with_line_breaks_stays_in_its_comment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A title is written into a comment: a line break in it would start catalog YAML of
    the document author's choosing."""
    spec = document(
        tmp_path,
        {"/a": {"get": {"operationId": "a"}}},
        info={"title": "Shop\nnotify:\n  - url: https://evil.example/\r\n", "version": "1"},
    )
    status, out, err = run(capsys, spec, "--provider", "shop")
    assert status == 0, err
    assert "evil.example" in out.splitlines()[0]  # still in the first, comment, line
    assert checked(tmp_path, out).webhooks == ()
