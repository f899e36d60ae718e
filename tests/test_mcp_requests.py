"""What makes two MCP requests the same (pure): the key a mutation executes under, and the
elicitation modes a client's declaration allows."""

from __future__ import annotations

import mcp_types as types

from app.calls.models import IdempotencyKey
from app.mcp.calls import request_key
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
    def declared(**modes: object) -> frozenset[str]:
        elicitation = types.ElicitationCapability.model_validate(modes)
        return elicitation_modes(types.ClientCapabilities(elicitation=elicitation))

    assert elicitation_modes(None) == frozenset()
    assert elicitation_modes(types.ClientCapabilities()) == frozenset()
    assert declared() == {"form"}  # an empty declaration predates URL mode: forms
    assert declared(url={}) == {"url"}
    assert declared(form={}, url={}) == {"form", "url"}


def test_arguments_nested_deeper_than_python_writes_still_have_a_key() -> None:
    """The SDK parses JSON nested far deeper than ``json.dumps`` writes it again."""
    deep: object = []
    for _ in range(5_000):
        deep = [deep]
    assert request_key("s", 1, "t", {"x": deep}) != request_key("s", 1, "t", {"x": []})
