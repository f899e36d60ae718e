"""Every endpoint under generated input: never a 5xx, and every refusal is a problem.

Hypothesis generates requests for all routes (valid-shaped and arbitrary JSON bodies, NUL
and control characters, lone surrogates, huge and non-finite numbers, wrong types, unknown
fields, odd path ids, query strings and cursors, valid and forged tokens) and sends them in
process through the ASGI app, against the real test database and providers. A call id in
an answer is then read back (``GET /calls/{id}``, ``GET /audit``), so input that was stored
but cannot be read back fails too. Examples are derandomized: CI runs the same ones.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SECRET, Providers
from tests.flows import Flow, refund_args

Auth = Callable[..., dict[str, str]]


@dataclass(frozen=True)
class Raw:
    """A JSON number token written as is (``NaN``, ``1e400``, a 400-digit integer)."""

    text: str


def dump(value: Any) -> str:
    """JSON text with ASCII escapes, so NUL and lone surrogates reach the server escaped."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(value)]
    return json.dumps(value)


ODD_STRINGS = [
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "\x01\x1f\x7f",
    "\u2028\ufeff",
    "é" * 3,
    "x" * 300,
    "%00",
    "../../etc",
    "ord_1",
    "alice",
]
texts = st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=12))
NON_FINITE = {"1e400", "-1e400", "9" * 400 + ".0", "NaN", "Infinity", "-Infinity"}


def non_finite(value: Any) -> bool:
    """Whether JSON text made of ``value`` holds a number no double can hold."""
    if isinstance(value, Raw):
        return value.text in NON_FINITE
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(non_finite(v) for v in value.values())
    return isinstance(value, list) and any(non_finite(v) for v in value)


huge = st.one_of(
    st.integers(min_value=2**53, max_value=10**30),
    st.sampled_from(
        [
            Raw("9" * 400),
            Raw("-" + "9" * 400),
            Raw("9" * 5000),
            Raw("1e400"),
            Raw("-1e400"),
            Raw("9" * 400 + ".0"),
            Raw("NaN"),
            Raw("Infinity"),
            Raw("-Infinity"),
        ]
    ),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(),
    huge,
    texts,
)


def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` three times in four: valid shapes reach deeper than junk does."""
    return st.one_of(usual, usual, usual, odd)


def nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=8,
    )


json_values = nested(scalars)
claim_values = nested(st.none() | st.booleans() | st.integers() | st.floats() | texts)

VALID_ARGUMENTS = [
    ("get_order", {"order_id": "ord_1"}),
    ("issue_refund", refund_args(50.0)),
    ("issue_refund", refund_args(150.0)),
    ("create_ticket", {"subject": "s", "body": "b"}),
    ("add_ticket_comment", {"ticket_id": "tck_1", "body": "b"}),
    ("get_customer", {"customer_id": "cus_1"}),
]


@st.composite
def tool_call(draw: st.DrawFn) -> dict[str, Any]:
    """A tool and arguments: a valid call with one argument changed or added, or junk."""
    tool, arguments = draw(st.sampled_from(VALID_ARGUMENTS))
    arguments = dict(arguments)
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(arguments)) | texts)
        arguments[key] = draw(huge | texts | json_values)
    return {
        "tool": draw(st.just(tool) | texts | json_values),
        "arguments": arguments if draw(st.integers(0, 5)) else draw(json_values),
    }


@dataclass
class Known:
    """Ids that exist, so that generated requests also reach past the lookups."""

    run_id: str = ""
    call_id: str = ""
    snapshot_hash: str = ""
    seen_calls: set[str] = field(default_factory=set)

    def ids(self) -> st.SearchStrategy[Any]:
        return st.sampled_from([self.run_id, self.call_id, self.snapshot_hash]) | texts


def cursors() -> st.SearchStrategy[str]:
    encoded = json_values.map(lambda v: base64.urlsafe_b64encode(dump(v).encode()).decode())
    return st.one_of(
        encoded,
        encoded.map(lambda c: c.rstrip("=")),
        st.sampled_from(
            [
                base64.urlsafe_b64encode(b'["not a time", "call_x"]').decode(),
                base64.urlsafe_b64encode(b'["\\u0000", "call_x"]').decode(),
                base64.urlsafe_b64encode(b'["2026-01-01T00:00:00+00:00", 5]').decode(),
                base64.urlsafe_b64encode(("[" + "9" * 30 + "]").encode()).decode(),
                base64.urlsafe_b64encode('["\u00b2"]'.encode()).decode(),
                base64.urlsafe_b64encode(b'["99999999999999999999999"]').decode(),
            ]
        ),
        texts,
    )


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any = None
    """``None``: no body; else JSON text made by ``dump`` (a ``Raw`` body: that text)."""
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def segment(value: Any) -> str:
    """Percent-encoded as UTF-8, lone surrogates too (as a careless client would send them)."""
    return quote(str(value).encode("utf-8", "surrogatepass"), safe="")


@st.composite
def requests(draw: st.DrawFn, known: Known) -> Call:
    ids = known.ids()
    body = st.one_of(json_values, json_values.map(lambda v: Raw(dump(v)[:-1])))
    endpoint = draw(
        st.sampled_from(
            [
                *["propose", "execute"] * 3,
                "dry-run",
                "approve",
                *["runs"] * 2,
                "finish",
                "get-run",
                "get-call",
                "approvals",
                "catalog",
                "audit",
                "export",
                "verify",
                "healthz",
                "readyz",
                "metrics",
            ]
        )
    )
    extra = mostly(st.just({}), st.dictionaries(texts, json_values, min_size=1, max_size=1))
    if endpoint in ("propose", "execute"):
        shaped = draw(tool_call())
        optional = ["run_id", "tool_call_id"] if endpoint == "propose" else []
        optional += ["approval_id", "dry_run_id", "call_id", "run_id"][
            : 4 * (endpoint == "execute")
        ]
        for name in draw(st.lists(st.sampled_from(optional), max_size=2, unique=True)):
            shaped[name] = draw(ids | json_values)
        shaped.update(draw(extra))
        headers = {}
        if endpoint == "execute":
            headers["idempotency-key"] = draw(
                st.sampled_from(["key-fuzz-0000000001", "key-fuzz-0000000002", "", "k" * 300])
                | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20)
            )
        return Call("POST", f"/{endpoint}", draw(mostly(st.just(shaped), body)), headers=headers)
    if endpoint == "dry-run":
        return Call("POST", "/dry-run", draw(st.fixed_dictionaries({"call_id": ids}) | body))
    if endpoint == "approve":
        shaped = draw(
            st.fixed_dictionaries(
                {
                    "call_id": ids,
                    "snapshot_hash": ids | st.none(),
                    "decision": st.sampled_from(["approve", "reject"]) | texts,
                },
                optional={"comment": texts | json_values},
            )
        )
        return Call("POST", "/approve", draw(mostly(st.just(shaped), body)))
    if endpoint == "runs":
        shaped = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "task": texts | json_values,
                    "limits": st.dictionaries(
                        st.sampled_from(["max_calls", "max_cost", "max_repeats"]) | texts,
                        huge | scalars,
                        max_size=3,
                    ),
                },
            )
        )
        return Call("POST", "/runs", draw(mostly(st.just(shaped), st.none() | body)))
    if endpoint == "finish":
        shaped = draw(
            st.fixed_dictionaries(
                {"status": st.sampled_from(["completed", "failed"]) | texts},
                optional={"reason": texts | json_values},
            )
        )
        return Call(
            "POST", f"/runs/{segment(draw(ids))}/finish", draw(mostly(st.just(shaped), body))
        )
    if endpoint == "get-run":
        return Call("GET", f"/runs/{segment(draw(ids))}")
    if endpoint == "get-call":
        return Call("GET", f"/calls/{segment(draw(ids))}")
    query: dict[str, st.SearchStrategy[Any]] = {
        "approvals": {"status": st.sampled_from(["pending", "approved"]) | texts},
        "catalog": {"format": st.sampled_from(["raw", "openai", "anthropic", "mcp"]) | texts},
        "audit": {
            "tenant": texts,
            "actor": texts,
            "tool": texts,
            "call_id": ids,
            "run_id": ids,
            "event": texts,
            "since": st.sampled_from(["2026-01-01T00:00:00Z", "9999-99-99T99:99:99Z"]) | texts,
            "until": texts,
            "limit": st.integers() | texts,
        },
    }.get(endpoint.replace("export", "audit"), {})
    if endpoint in ("approvals", "audit", "export"):
        query["cursor"] = cursors()
    params = draw(st.fixed_dictionaries({}, optional=query))
    path = {"export": "/audit/export", "verify": "/audit/verify"}.get(endpoint, f"/{endpoint}")
    return Call("GET", path, params={k: str(v) for k, v in params.items()})


def forged(claims: dict[str, Any]) -> str:
    return jwt.encode({"exp": int(time.time()) + 600, **claims}, SECRET, algorithm="HS256")


def tokens(auth: Auth) -> st.SearchStrategy[dict[str, str]]:
    claims = st.fixed_dictionaries(
        {},
        optional={
            "sub": st.just("alice") | claim_values,
            "tid": st.just("acme") | claim_values,
            "roles": st.just(["support"]) | claim_values,
            "sid": claim_values,
        },
    )
    valid = [auth(), auth(), auth(sub="bob", roles="finance_approver"), auth(roles="admin")]
    refused = [{}, {"authorization": "Bearer not-a-token"}, {"authorization": "Basic abc"}]
    return mostly(
        st.sampled_from(valid),
        st.sampled_from(refused) | claims.map(lambda c: {"authorization": f"Bearer {forged(c)}"}),
    )


def check(response: httpx.Response, call: Call) -> None:
    """The property: no 5xx other than a dependency's 503, every 4xx a problem, and a body
    with a non-finite number refused as a malformed request (unless the token was)."""
    where = f"{call.method} {call.path} {call.params} -> {response.status_code} {response.text}"
    assert response.status_code < 500 or response.status_code == 503, where
    if response.status_code >= 400:
        assert response.headers["content-type"] == "application/problem+json", where
        assert isinstance(response.json().get("code"), str), where
    if non_finite(call.body):
        refused = ("invalid_request", "unauthenticated", "not_found")
        assert response.json().get("code") in refused, where


@pytest.fixture
async def known(client: httpx.AsyncClient, auth: Auth) -> Known:
    flow = Flow(client, auth)
    run = await client.post("/runs", json={"task": "fuzz"}, headers=auth())
    proposal = await flow.propose("issue_refund", refund_args(150.0))
    preview = await flow.dry_run(proposal["call_id"])
    return Known(run.json()["run_id"], proposal["call_id"], preview["snapshot_hash"])


@pytest.fixture
async def raw_client(
    app: Any, clean: None, providers: Providers
) -> AsyncIterator[httpx.AsyncClient]:
    """The app's own 500s come back as responses, not as exceptions in the test."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://toolgate") as c:
        yield c


@settings(
    max_examples=2500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_no_generated_request_gets_a_server_error_or_a_non_problem_refusal(
    raw_client: httpx.AsyncClient, auth: Auth, known: Known, data: st.DataObject
) -> None:
    call = data.draw(requests(known), label="request")
    headers = {**data.draw(tokens(auth), label="identity"), **call.headers}
    content = None
    if call.body is not None:
        content = dump(call.body).encode("utf-8", "surrogatepass")
        headers["content-type"] = data.draw(
            st.sampled_from(["application/json", "application/json", "text/plain"])
        )
    query = "&".join(f"{segment(k)}={segment(v)}" for k, v in call.params.items())
    response = await raw_client.request(
        call.method, f"{call.path}?{query}", content=content, headers=headers
    )
    check(response, call)
    if response.headers.get("content-type") in ("application/json", "application/problem+json"):
        call_id = response.json().get("call_id")
        if isinstance(call_id, str) and call_id not in known.seen_calls:
            await read_back(raw_client, call_id, auth(sub="root", roles="admin"))
            known.seen_calls.add(call_id)


async def read_back(client: httpx.AsyncClient, call_id: str, admin: dict[str, str]) -> None:
    """What was stored of a call can be read back by an admin, its history and its audit."""
    for path, params in (
        (f"/calls/{call_id}", {}),
        ("/audit", {"call_id": call_id}),
        ("/audit/export", {"call_id": call_id}),
    ):
        read = await client.get(path, params=params, headers=admin)
        assert read.status_code == 200, f"{path} of {call_id}: {read.text}"
