"""What makes two MCP requests the same (pure): the key a mutation executes under, and the
elicitation modes a client's declaration allows."""

from __future__ import annotations

import json

import mcp_types as types
from mcp_types.version import LATEST_MODERN_VERSION

from app.calls.models import IdempotencyKey
from app.mcp.calls import request_key
from app.mcp.router import asks_for_a_session
from app.mcp.server import elicitation_modes


def test_a_resent_request_has_the_key_of_the_first_whatever_the_key_order() -> None:
    first = request_key("s1", 7, "create_ticket", {"subject": "a", "body": "b"})
    resent = request_key("s1", 7, "create_ticket", {"body": "b", "subject": "a"})
    assert first == resent
    assert IdempotencyKey.parse(first).value == first  # a key /execute accepts


def test_another_id_session_tool_or_argument_is_another_request() -> None:
    key = request_key("s1", 7, "create_ticket", {"subject": "a"})
    others = [
        request_key("s1", 8, "create_ticket", {"subject": "a"}),
        request_key("s1", "7", "create_ticket", {"subject": "a"}),
        request_key("s2", 7, "create_ticket", {"subject": "a"}),
        request_key("s1", 7, "add_ticket_comment", {"subject": "a"}),
        request_key("s1", 7, "create_ticket", {"subject": "b"}),
    ]
    assert key not in others
    assert len(set(others)) == len(others)


def test_arguments_json_cannot_say_exactly_still_have_a_key() -> None:
    assert request_key("s", 1, "t", {"n": 10**40, "x": float("nan"), "s": "\ud800"})


def test_the_declared_elicitation_modes_decide_how_toolgate_may_ask() -> None:
    def declared(revision: str = LATEST_MODERN_VERSION, **modes: object) -> frozenset[str]:
        elicitation = types.ElicitationCapability.model_validate(modes)
        capabilities = types.ClientCapabilities(elicitation=elicitation)
        return elicitation_modes(capabilities, revision, revision == "2025-11-25")

    assert elicitation_modes(None, LATEST_MODERN_VERSION, False) == frozenset()
    assert elicitation_modes(types.ClientCapabilities(), LATEST_MODERN_VERSION, False) == set()
    assert declared() == {"form"}  # an empty declaration predates URL mode: forms
    assert declared(url={}) == {"url"}
    assert declared(form={}, url={}) == {"form", "url"}
    assert declared("2025-11-25", form={}, url={}) == {"form", "url"}  # with a session


def test_a_handshake_client_is_asked_only_in_a_session_and_only_as_its_revision_can() -> None:
    both = types.ClientCapabilities(
        elicitation=types.ElicitationCapability.model_validate({"form": {}, "url": {}})
    )
    assert elicitation_modes(both, "2025-11-25", False) == frozenset()  # nowhere to ask
    assert elicitation_modes(both, "2025-06-18", True) == {"form"}  # no URL mode yet


def test_arguments_nested_deeper_than_python_writes_still_have_a_key() -> None:
    """The SDK parses JSON nested far deeper than ``json.dumps`` writes it again."""
    deep: object = []
    for _ in range(5_000):
        deep = [deep]
    assert request_key("s", 1, "t", {"x": deep}) != request_key("s", 1, "t", {"x": []})


def test_only_a_handshake_initialize_that_declares_elicitation_asks_for_a_session() -> None:
    def initialize(revision: object = "2025-11-25", elicitation: object = None) -> bytes:
        capabilities = {} if elicitation is None else {"elicitation": elicitation}
        params = {"protocolVersion": revision, "capabilities": capabilities}
        return json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
        ).encode()

    assert asks_for_a_session(initialize(elicitation={}))
    assert asks_for_a_session(initialize("2025-06-18", {"form": {}}))
    assert not asks_for_a_session(initialize())  # declares nothing
    assert not asks_for_a_session(initialize("2025-03-26", {}))  # before elicitation
    assert not asks_for_a_session(initialize(["2025-11-25"], {}))  # not a revision at all
    assert not asks_for_a_session(initialize(elicitation=True))
    for body in (b"", b"[]", b'"initialize"', b"{}", b'{"method": "initialize", "params": 1}'):
        assert not asks_for_a_session(body)
