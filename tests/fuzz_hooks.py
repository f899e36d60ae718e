"""schemathesis hooks for ``test_schemathesis`` (loaded through ``SCHEMATHESIS_HOOKS``).

The OpenAPI document says what a body looks like, not which tools the catalog holds: bodies
generated from it alone are refused as ``unknown_tool`` or ``invalid_arguments`` before
any deeper rule runs. So the bodies of ``/propose`` and ``/execute`` are drawn half of the
time from calls the demo catalog knows (reads, a low- and a high-impact refund, another
tenant's order, a spoofed identity, a ticket), with generated values mixed into their
arguments; the OpenAPI links then carry such a call on through dry-run, approval and
execution by its id, in a run or outside one. A long poll (``GET /calls/{id}?wait=S``)
waits at most a second, so that the run spends its time on requests, not on waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import schemathesis
from hypothesis import strategies as st

F = TypeVar("F", bound=Callable[..., Any])


def hook(name: str, method: str, path: str) -> Callable[[F], F]:
    """``schemathesis.hook(name).apply_to(method=…, path=…)``, typed for mypy."""
    register: Any = schemathesis.hook(name)
    return cast(Callable[[F], F], register.apply_to(method=method, path=path))


CALLS: list[dict[str, Any]] = [
    {"tool": "get_order", "arguments": {"order_id": "ord_1"}},
    {"tool": "get_order", "arguments": {"order_id": "ord_9"}},  # another tenant's
    {
        "tool": "issue_refund",
        "arguments": {"order_id": "ord_1", "amount": 150, "customer_id": "alice"},
    },
    {
        "tool": "issue_refund",
        "arguments": {"order_id": "ord_1", "amount": 4000, "customer_id": "alice"},
    },
    {
        "tool": "issue_refund",
        "arguments": {"order_id": "ord_1", "amount": 30, "customer_id": "alice"},
    },
    {
        "tool": "issue_refund",
        "arguments": {"order_id": "ord_1", "amount": 30, "customer_id": "dave"},
    },
    {"tool": "create_ticket", "arguments": {"subject": "fuzz", "body": "fuzz"}},
]
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
CHANGES = st.dictionaries(
    st.sampled_from(["amount", "order_id", "customer_id", "x"]), JSON, max_size=1
)
KNOWN_CALLS = st.builds(
    lambda call, change: {**call, "arguments": {**call["arguments"], **change}},
    st.sampled_from(CALLS),
    st.just({}) | CHANGES,
)
"""A call the catalog knows, its arguments as they are or with one member changed."""


@hook("before_generate_body", "POST", "/propose")
def propose_known_calls(context: Any, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return KNOWN_CALLS | strategy


@hook("before_generate_body", "POST", "/execute")
def execute_known_calls(context: Any, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return KNOWN_CALLS | strategy


@hook("map_query", "GET", "/calls/{call_id}")
def short_waits(context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    wait = (query or {}).get("wait")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 1:
        return {**(query or {}), "wait": 1}
    return query


@hook("before_generate_body", "POST", "/runs")
def runs_with_room(context: Any, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A run with the server's limits, as well as generated ones (often a budget of one)."""
    return st.sampled_from([{}, {"task": "Refund 150 EUR on order ord_1 to alice"}]) | strategy
