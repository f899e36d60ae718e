"""Traces, /metrics and JSON logs, seen through the ASGI app and the demo providers."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import CarrierT, Setter, TextMapPropagator, default_setter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.parser import text_string_to_metric_families

from app import telemetry
from app.logs import JsonFormatter, QueuedStream
from app.telemetry import tracing
from tests.conftest import Providers
from tests.test_instances import Instance

Auth = Callable[..., dict[str, str]]
GET_ORDER = {"tool": "get_order", "arguments": {"order_id": "ord_1"}}
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@pytest.fixture(scope="session")
def span_exporter(app: Any) -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    telemetry.add_span_processor(provider, SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(span_exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    span_exporter.clear()
    return span_exporter


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """JSON lines of ``toolgate.calls``, formatted where they are logged, as in production."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("toolgate.calls")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(level)


def named(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = [s for s in spans.get_finished_spans() if s.name == name]
    return span


def context(span: ReadableSpan) -> SpanContext:
    """The span's context; a finished SDK span always has one."""
    found = span.get_span_context()
    assert found is not None
    return found


def traceparent(span: ReadableSpan) -> str:
    ids = context(span)
    return f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"


def provider_header(requests: list[dict[str, Any]], path: str) -> str:
    [request] = [r for r in requests if r["path"] == path]
    return str(request["headers"]["traceparent"])


async def test_an_execute_is_a_request_span_whose_provider_call_is_an_execute_tool_child(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, spans: InMemorySpanExporter
) -> None:
    response = await client.post("/execute", json=GET_ORDER, headers=auth())
    assert response.status_code == 200, response.text
    call_id = response.json()["call_id"]

    server = named(spans, "POST /execute")
    assert server.kind is SpanKind.SERVER
    assert server.parent is None
    assert (
        dict(server.attributes or {}).items()
        >= {
            "http.request.method": "POST",
            "http.route": "/execute",
            "http.response.status_code": 200,
            "toolgate.call_id": call_id,
        }.items()
    )
    tool = named(spans, "execute_tool get_order")
    assert tool.kind is SpanKind.CLIENT
    assert tool.parent is not None
    assert tool.parent.span_id == context(server).span_id
    assert context(tool).trace_id == context(server).trace_id
    attributes = dict(tool.attributes or {})
    policy_version = attributes["toolgate.policy_version"]
    assert isinstance(policy_version, str)
    assert policy_version.startswith("demo-2026-11-29#")
    assert (
        attributes.items()
        >= {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "get_order",
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            "toolgate.call_id": call_id,
            "server.address": "127.0.0.1",
            "http.response.status_code": 200,
        }.items()
    )
    assert "toolgate.operation_id" not in attributes
    owner = named(spans, "owner_lookup order")
    assert owner.parent is not None
    assert owner.parent.span_id == context(server).span_id

    requests = await providers.requests()
    assert provider_header(requests, "/billing/orders/ord_1") == traceparent(tool)
    assert provider_header(requests, "/billing/orders/ord_1/owner") == traceparent(owner)


async def test_a_mutation_span_carries_the_operation_id_sent_as_idempotency_key(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, spans: InMemorySpanExporter
) -> None:
    body = {"tool": "create_ticket", "arguments": {"subject": "late", "body": "where is it?"}}
    response = await client.post(
        "/execute", json=body, headers={**auth(), "Idempotency-Key": "telemetry-key-0000001"}
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    tool = named(spans, "execute_tool create_ticket")
    attributes = dict(tool.attributes or {})
    assert attributes["toolgate.operation_id"] == answer["operation_id"]
    assert attributes["gen_ai.tool.call.id"] == answer["call_id"]
    [request] = await providers.requests()
    assert request["headers"]["Idempotency-Key"] == answer["operation_id"]
    assert request["headers"]["traceparent"] == traceparent(tool)


async def test_an_incoming_traceparent_is_continued_to_the_provider(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, spans: InMemorySpanExporter
) -> None:
    caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    response = await client.post(
        "/execute", json=GET_ORDER, headers={**auth(), "traceparent": caller}
    )
    assert response.status_code == 200, response.text
    server = named(spans, "POST /execute")
    assert context(server).trace_id == int(CALLER_TRACE, 16)
    assert server.parent is not None
    assert server.parent.span_id == int(CALLER_SPAN, 16)
    assert server.parent.is_remote
    sent = provider_header(await providers.requests(), "/billing/orders/ord_1")
    assert sent.split("-")[1] == CALLER_TRACE
    assert sent == traceparent(named(spans, "execute_tool get_order"))


async def test_while_nothing_exports_providers_get_the_unsampled_request_context(
    client: httpx.AsyncClient,
    auth: Auth,
    providers: Providers,
    spans: InMemorySpanExporter,
    log_lines: io.StringIO,
) -> None:
    sampler = cast(TracerProvider, trace.get_tracer_provider()).sampler
    assert isinstance(sampler, telemetry.WhileExporting)
    sampler.exporting = False
    try:
        response = await client.post("/execute", json=GET_ORDER, headers=auth())
        caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
        sampled = await client.post(
            "/execute", json=GET_ORDER, headers={**auth(), "traceparent": caller}
        )
    finally:
        sampler.exporting = True
    assert (response.status_code, sampled.status_code) == (200, 200)
    requests = await providers.requests()
    # Unsampled: no span at all, and both provider calls are told the request's own span.
    [owner, forwarded] = [
        r["headers"]["traceparent"]
        for r in requests
        if r["path"].startswith("/billing/orders/ord_1") and CALLER_TRACE not in str(r)
    ]
    assert owner == forwarded
    assert not int(owner.rsplit("-", 1)[1], 16) & 1  # the sampled flag is off
    # ...and the request's log line names the same trace and span.
    [line] = [json.loads(line) for line in log_lines.getvalue().splitlines()][:1]
    assert (line["call_id"], f"00-{line['trace_id']}-{line['span_id']}-00") == (
        response.json()["call_id"],
        owner,
    )
    # A caller's sampled trace is still recorded, provider spans included, and stays sampled.
    assert {s.name for s in spans.get_finished_spans()} == {
        "POST /execute",
        "owner_lookup order",
        "execute_tool get_order",
    }
    assert provider_header(
        [r for r in requests if CALLER_TRACE in str(r)], "/billing/orders/ord_1"
    ) == traceparent(named(spans, "execute_tool get_order"))


async def test_a_provider_error_marks_its_span_and_counts_a_failed_execution(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, spans: InMemorySpanExporter
) -> None:
    before = await scrape(client)
    await providers.fault("/billing/orders/ord_1", "status_500")
    response = await client.post("/execute", json=GET_ORDER, headers=auth())
    assert response.status_code == 504
    span = named(spans, "execute_tool get_order")
    assert span.status.status_code is StatusCode.ERROR
    assert (
        dict(span.attributes or {}).items()
        >= {
            "error.type": "500",
            "http.response.status_code": 500,
        }.items()
    )
    after = await scrape(client)
    executions = "toolgate_executions_total"
    assert delta(before, after, executions, tool="get_order", status="failed") == 1
    assert delta(before, after, executions, tool="get_order", status="succeeded") == 0


async def test_a_provider_timeout_names_the_transport_error_on_the_span(
    client: httpx.AsyncClient, auth: Auth, providers: Providers, spans: InMemorySpanExporter
) -> None:
    await providers.fault("/billing/orders/ord_1", "stall_before_effect", seconds=2)
    response = await client.post("/execute", json=GET_ORDER, headers=auth())
    assert response.status_code == 504
    span = named(spans, "execute_tool get_order")
    assert span.status.status_code is StatusCode.ERROR
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == "Uncertain"
    assert "http.response.status_code" not in attributes
    server = named(spans, "POST /execute")
    assert server.status.status_code is StatusCode.ERROR
    assert dict(server.attributes or {})["error.type"] == "504"


async def test_a_dry_run_has_its_own_clearly_named_span(
    client: httpx.AsyncClient, auth: Auth, spans: InMemorySpanExporter
) -> None:
    arguments = {"order_id": "ord_1", "amount": 20, "customer_id": "alice"}
    proposal = await client.post(
        "/propose", json={"tool": "issue_refund", "arguments": arguments}, headers=auth()
    )
    assert proposal.status_code == 200, proposal.text
    call_id = proposal.json()["call_id"]
    response = await client.post("/dry-run", json={"call_id": call_id}, headers=auth())
    assert response.status_code == 200, response.text
    span = named(spans, "dry_run issue_refund")
    attributes = dict(span.attributes or {})
    assert (attributes["toolgate.endpoint"], attributes["toolgate.call_id"]) == ("dry_run", call_id)
    assert "gen_ai.operation.name" not in attributes
    assert context(named(spans, "POST /dry-run")).trace_id == context(span).trace_id


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return samples(response.text)


def delta(
    before: dict[tuple[str, frozenset[tuple[str, str]]], float],
    after: dict[tuple[str, frozenset[tuple[str, str]]], float],
    name: str,
    **labels: str,
) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def test_metrics_count_decisions_executions_and_latencies_without_auth(
    client: httpx.AsyncClient, auth: Auth
) -> None:
    before = await scrape(client)
    allowed = await client.post("/execute", json=GET_ORDER, headers=auth())
    denied = await client.post(
        "/execute", json={"tool": "get_order", "arguments": {"order_id": "ord_9"}}, headers=auth()
    )
    unknown = await client.post("/propose", json={"tool": "nope", "arguments": {}}, headers=auth())
    missing = await client.get("/no/such/path")
    assert [r.status_code for r in (allowed, denied, unknown, missing)] == [200, 403, 404, 404]
    after = await scrape(client)

    decisions = "toolgate_decisions_total"
    assert delta(before, after, decisions, tool="get_order", outcome="allow", code="") == 1
    assert (
        delta(before, after, decisions, tool="get_order", outcome="deny", code="tool_forbidden")
        == 1
    )
    assert delta(before, after, decisions, tool="unknown", outcome="deny", code="unknown_tool") == 1
    executions = "toolgate_executions_total"
    assert delta(before, after, executions, tool="get_order", status="succeeded") == 1
    requests = "toolgate_request_duration_seconds_count"
    assert delta(before, after, requests, route="/execute", method="POST", status="200") == 1
    assert delta(before, after, requests, route="/execute", method="POST", status="403") == 1
    assert delta(before, after, requests, route="unmatched", method="GET", status="404") == 1
    assert (
        delta(
            before,
            after,
            "toolgate_request_duration_seconds_bucket",
            route="/execute",
            method="POST",
            status="200",
            le="+Inf",
        )
        == 1
    )
    provider = "toolgate_provider_duration_seconds_count"
    assert delta(before, after, provider, provider="billing", endpoint="execute") == 1
    assert delta(before, after, provider, provider="billing", endpoint="owner") == 2


async def test_a_decision_log_line_is_json_with_call_id_and_trace_id_but_no_arguments(
    client: httpx.AsyncClient, auth: Auth, spans: InMemorySpanExporter, log_lines: io.StringIO
) -> None:
    proposed = await client.post("/propose", json=GET_ORDER, headers=auth())
    assert proposed.status_code == 200, proposed.text
    response = await client.post("/execute", json=GET_ORDER, headers=auth())
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    trace_ids = [
        f"{context(named(spans, f'POST /{path}')).trace_id:032x}" for path in ("propose", "execute")
    ]
    # An execution is one line: the allow it implies is counted, not logged again.
    assert [(line["message"], line["call_id"], line["trace_id"]) for line in lines] == [
        ("allow get_order", proposed.json()["call_id"], trace_ids[0]),
        ("executed get_order: succeeded", response.json()["call_id"], trace_ids[1]),
    ]
    assert lines[0]["level"] == "INFO"
    assert lines[0]["logger"] == "toolgate.calls"
    assert (lines[0]["outcome"], lines[1]["status"]) == ("allow", "succeeded")
    assert "ord_1" not in log_lines.getvalue()


async def test_a_denial_log_line_names_its_code(
    client: httpx.AsyncClient, auth: Auth, log_lines: io.StringIO
) -> None:
    response = await client.post(
        "/propose", json={"tool": "get_order", "arguments": {"order_id": "ord_9"}}, headers=auth()
    )
    assert response.status_code == 403
    [line] = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    assert (line["message"], line["code"], line["call_id"]) == (
        "deny get_order: tool_forbidden",
        "tool_forbidden",
        response.json()["call_id"],
    )


class _Attempt:
    tool_name = "get_order"
    tool = None
    run_id = "run_42"
    catalog: Any = None


async def test_every_log_line_of_a_request_carries_its_call_and_run_ids(
    span_exporter: InMemorySpanExporter,
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("toolgate.test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        telemetry.bind_call(_Attempt(), "call_abc")
        logger.info("inside")
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    try:
        transport = httpx.ASGITransport(app=telemetry.TelemetryMiddleware(endpoint))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            assert (await c.get("/x")).status_code == 204
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (inside["call_id"], inside["run_id"], len(inside["trace_id"])) == (
        "call_abc",
        "run_42",
        32,
    )
    assert "call_id" not in outside
    assert "trace_id" not in outside


def test_queued_stream_writes_json_lines_from_its_own_thread() -> None:
    stream = io.StringIO()
    handler = QueuedStream(stream)
    handler.setFormatter(JsonFormatter())
    record = logging.LogRecord("toolgate", logging.WARNING, __file__, 1, "hello %s", ("x",), None)
    handler.handle(record)
    handler.close()
    handler.close()
    [line] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert (line["message"], line["level"], line["logger"]) == ("hello x", "WARNING", "toolgate")
    assert line["time"].endswith("+00:00")


HOSTILE_TRACE_HEADERS: list[dict[str, str]] = [
    # Each member not ASCII: the baggage propagator warns once per member, ~2,700 per request.
    {"baggage": "\x80," * 2700},
    {"baggage": "k=" + "v" * 60_000},  # over its 8 KiB: warned with the whole header quoted
    {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "x" * 500},
    {"traceparent": "0" * 600},
]


async def test_hostile_trace_headers_write_no_log_lines(
    env: dict[str, str], auth: Auth, clean: None, tmp_path: Path
) -> None:
    """Trace headers are anyone's, before authentication: logging what is wrong with them
    let one request write thousands of lines, pushing real ones out of the log queue."""
    log = tmp_path / "stderr"
    served = Instance(env, log=log)
    try:
        await served.ready()
        started = log.read_bytes().count(b"\n")
        async with httpx.AsyncClient(base_url=served.url) as client:
            for headers in HOSTILE_TRACE_HEADERS:
                sent = {k.encode(): v.encode("latin-1") for k, v in headers.items()}
                assert (await client.get("/healthz", headers=sent)).status_code == 200
            unknown = {"tool": "nope", "arguments": {}}
            denied = await client.post("/propose", json=unknown, headers=auth())
            assert denied.status_code == 404
        deadline = time.monotonic() + 5
        while b"unknown_tool" not in log.read_bytes() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # a line logged after the denial would be written by now
        lines = [json.loads(line) for line in log.read_bytes().splitlines()[started:]]
    finally:
        served.stop()
    # Judged by what the headers could cause, not by counting: a start-up line of the
    # instance (its sealer is a process of its own) may be written after ``started``.
    about_headers = [
        line
        for line in lines
        if line["logger"].startswith("opentelemetry")
        or any(name in json.dumps(line) for name in ("baggage", "tracestate", "traceparent"))
    ]
    assert about_headers == []
    denials = [line["message"] for line in lines if line["logger"] == "toolgate.calls"]
    assert denials == ["deny unknown: unknown_tool"]


@given(st.floats(min_value=0, max_value=2**34, allow_nan=False))
def test_a_log_lines_time_is_its_records_time_to_the_millisecond(created: float) -> None:
    assert JsonFormatter().time(created) == datetime.fromtimestamp(created, UTC).isoformat(
        timespec="milliseconds"
    )


span_ids = st.builds(
    SpanContext,
    trace_id=st.integers(1, 2**128 - 1),
    span_id=st.integers(1, 2**64 - 1),
    is_remote=st.just(False),
    trace_flags=st.sampled_from([TraceFlags(0), TraceFlags(1)]),
    trace_state=st.sampled_from([None, TraceState([("ot", "th:8")])]),  # a sampler's
)


def injected(ids: SpanContext) -> dict[str, str]:
    """What the global propagator writes for a span alone in its context."""
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(NonRecordingSpan(ids), Context()))
    return headers


@given(span_ids)
def test_a_request_with_no_callers_context_sends_what_the_propagators_write(
    ids: SpanContext,
) -> None:
    assert tracing.carrier(NonRecordingSpan(ids), continued=False) == injected(ids)


class Correlation(TextMapPropagator):
    """A propagator of another header, as a deployment might configure beside W3C's."""

    def extract(self, carrier: CarrierT, context: Context | None = None, getter: Any = None) -> Any:
        return context

    def inject(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        setter: Setter[CarrierT] = default_setter,
    ) -> None:
        ids = trace.get_current_span(context).get_span_context()
        setter.set(carrier, "x-correlation", f"{ids.trace_id:x}")

    @property
    def fields(self) -> set[str]:
        return {"x-correlation"}


def test_other_configured_propagators_write_their_own_headers() -> None:
    ids = SpanContext(0xABC, 0xDEF, is_remote=False)
    default = propagate.get_global_textmap()
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), Correlation()])
    )
    try:
        sent = tracing.carrier(NonRecordingSpan(ids), continued=False)
    finally:
        propagate.set_global_textmap(default)
    assert sent == {
        "traceparent": f"00-{0xABC:032x}-{0xDEF:016x}-00",
        "x-correlation": "abc",
    }
    assert tracing.carrier(NonRecordingSpan(ids), continued=False) == injected(ids)


def test_otlp_export_is_installed_only_when_an_endpoint_is_configured() -> None:
    plain = telemetry.build_provider({})
    assert plain._active_span_processor._span_processors == ()
    tracer = plain.get_tracer("t")
    assert not tracer.start_span("unexported").is_recording()
    sampled = propagate.extract({"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert (
        tracer.start_span("under a sampled caller", context=sampled)
        .get_span_context()
        .trace_flags.sampled
    )
    assert plain.resource.attributes["service.name"] == "toolgate"
    plain.shutdown()

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_SERVICE_NAME": "tg-a"}
    exporting = telemetry.build_provider(env)
    [processor] = exporting._active_span_processor._span_processors
    assert isinstance(processor, BatchSpanProcessor)
    assert exporting.get_tracer("t").start_span("exported").is_recording()
    assert exporting.resource.attributes["service.name"] == "tg-a"
    assert telemetry.otlp_endpoint(env) == "http://collector:4318/v1/traces"
    exporting.shutdown()
    assert telemetry.otlp_endpoint({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/t"}) == (
        "http://c/t"
    )
    assert telemetry.otlp_endpoint({**env, "OTEL_TRACES_EXPORTER": "none"}) is None


def test_an_exporting_provider_samples_as_otel_traces_sampler_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    exporting = telemetry.build_provider(env)
    assert not exporting.get_tracer("t").start_span("sampled out").is_recording()
    exporting.shutdown()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
    exporting = telemetry.build_provider(env)
    assert exporting.get_tracer("t").start_span("sampled in").is_recording()
    exporting.shutdown()
