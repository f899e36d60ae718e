"""Telemetry: OpenTelemetry traces, the counters of ``app.metrics`` and the decision log.

Spans: one SERVER span per HTTP request (``TelemetryMiddleware``, which continues an incoming
``traceparent``) and one CLIENT span per provider request (``tool_call`` / ``owner_lookup``),
whose own context is what the provider receives as ``traceparent``. Execute calls carry the
OpenTelemetry GenAI ``execute_tool`` attributes. A request span is always created, so trace
ids propagate; spans leave the process only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``..._TRACES_ENDPOINT``) is set, through a ``BatchSpanProcessor`` whose exporter thread keeps
network I/O off the event loop, sampled as ``OTEL_TRACES_SAMPLER`` says. Until a span
processor is installed spans are non-recording (``WhileExporting``) and provider calls make
none of their own: the ids still reach log lines and providers, and nothing is built that
nothing would read.

Services report through three one-line hooks: ``bind_call`` (the call a request is deciding),
``decided`` (an allow or a denial, where it is stored) and ``executed`` (an outcome). Nothing
here sees argument values.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextvars import ContextVar
from functools import lru_cache
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from fastapi.telemetry import TelemetryConfig
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import SpanKind, StatusCode

from app import metrics

if TYPE_CHECKING:
    from app.catalog.models import Catalog, Endpoint, Provider, Tool

DEFAULT_SERVICE_NAME = "toolgate"
FASTAPI_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""For ``FastAPI(telemetry=...)``: its built-in spans would duplicate ``TelemetryMiddleware``'s
and add two per request (dependencies, endpoint); its metrics would need an OTel meter."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate", b"baggage"})
_tracer: trace.Tracer = trace.get_tracer("toolgate")
_log = logging.getLogger("toolgate.calls")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]


class WhileExporting(Sampler):
    """Record spans only once something can export them.

    Before ``add_span_processor``: a span is recorded only under a caller's sampled parent, so
    the caller's trace stays sampled for the providers downstream; every other span is
    non-recording but still has ids. After: the SDK's sampler from ``OTEL_TRACES_SAMPLER``
    decides (parent-based and always on unless set).
    """

    def __init__(self) -> None:
        self.exporting = False
        self._idle = ParentBased(ALWAYS_OFF)
        # The SDK reads OTEL_TRACES_SAMPLER (and _ARG) when it is given no sampler.
        self._on = TracerProvider(shutdown_on_exit=False).sampler

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return (self._on if self.exporting else self._idle).should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "WhileExporting"


def setup(env: Mapping[str, str]) -> None:
    """Install the SDK tracer provider once per process (later calls reuse it)."""
    global _tracer
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = build_provider(env)
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("toolgate")


def add_span_processor(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Export spans through ``processor`` from now on, recording them if they were not."""
    provider.add_span_processor(processor)
    if isinstance(provider.sampler, WhileExporting):
        provider.sampler.exporting = True


async def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still batched, at shutdown: uvicorn re-raises SIGTERM once it has
    stopped, so the process ends without running ``atexit`` hooks."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        await asyncio.to_thread(provider.force_flush, int(timeout_s * 1000))


def build_provider(env: Mapping[str, str]) -> TracerProvider:
    """A tracer provider named by ``OTEL_SERVICE_NAME``, exporting OTLP/HTTP if configured."""
    name = env.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME
    provider = TracerProvider(
        resource=Resource.create({"service.name": name}), sampler=WhileExporting()
    )
    endpoint = otlp_endpoint(env)
    if endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        add_span_processor(provider, BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def otlp_endpoint(env: Mapping[str, str]) -> str | None:
    """The traces URL, as the OTLP/HTTP exporter derives it from the standard variables."""
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


class CallAttempt(Protocol):
    """What telemetry reads of ``app.calls.decisions.Attempt``."""

    @property
    def tool_name(self) -> str: ...
    @property
    def tool(self) -> Tool | None: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def catalog(self) -> Catalog: ...


class RequestFields:
    """The request's correlation ids, for every log line and span it produces."""

    __slots__ = ("attempt", "call_id", "propagated", "run_id")

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.run_id: str | None = None
        self.attempt: CallAttempt | None = None
        self.propagated: dict[str, str] | None = None
        """The request span's ``traceparent`` (and ``tracestate``), once made."""


_fields: ContextVar[RequestFields | None] = ContextVar("toolgate_request_fields", default=None)


def current_fields() -> RequestFields | None:
    return _fields.get()


def bind_call(attempt: CallAttempt, call_id: str) -> None:
    """Remember the call this request is deciding, for log lines and provider spans."""
    fields = _fields.get()
    if fields is not None:
        fields.attempt, fields.call_id, fields.run_id = attempt, call_id, attempt.run_id


def decided(
    attempt: CallAttempt, call_id: str, code: str | None = None, *, quiet: bool = False
) -> None:
    """Count and log one stored decision: an allow, or a denial with its SPEC ``code``.
    ``quiet``: count only, as the ``executed`` line that follows says it was allowed."""
    tool = attempt.tool.name if attempt.tool is not None else metrics.UNKNOWN_TOOL
    outcome = "allow" if code is None else "deny"
    metrics.decisions(tool, outcome, code or "").inc()
    fields = _fields.get()
    if fields is not None:
        fields.call_id = call_id
    if quiet:
        return
    _log.info(
        "%s %s%s",
        outcome,
        tool,
        f": {code}" if code else "",
        extra={"fields": {"call_id": call_id, "tool": tool, "outcome": outcome, "code": code}},
    )


def executed(tool: str, call_id: str, status: str) -> None:
    """Count and log one execution outcome: succeeded, failed, unknown or replayed."""
    metrics.executions(tool, status).inc()
    _log.log(
        logging.WARNING if status == "unknown" else logging.INFO,
        "executed %s: %s",
        tool,
        status,
        extra={"fields": {"call_id": call_id, "tool": tool, "status": status}},
    )


class ProviderCall:
    """One provider request: a CLIENT span, its ``traceparent`` and the latency histogram.

    ``with call: call.inject(headers); ...; call.answered(status)``. A transport exception
    leaving the block marks the span as an error named after the exception's class. A request
    whose own span is not recorded gets no provider span either (``attributes`` is ``None``):
    nothing would read it, and the provider is told the request's span as its parent.
    """

    __slots__ = ("_attributes", "_endpoint", "_name", "_provider", "_span", "_started")

    def __init__(
        self, name: str, provider: str, endpoint: str, attributes: dict[str, Any] | None
    ) -> None:
        self._name, self._provider, self._endpoint = name, provider, endpoint
        self._attributes = attributes
        self._span: trace.Span = trace.INVALID_SPAN
        self._started = 0.0

    def __enter__(self) -> ProviderCall:
        if self._attributes is None:
            self._span = trace.get_current_span()
        else:
            self._span = _tracer.start_span(
                self._name, kind=SpanKind.CLIENT, attributes=self._attributes
            )
        self._started = time.perf_counter()
        return self

    def inject(self, headers: dict[str, str]) -> None:
        """Add ``traceparent`` naming this call's span, or else the request's, as the
        provider's parent. The request's is made once per request."""
        fields = _fields.get() if self._attributes is None else None
        if fields is None:
            propagate.inject(headers, context=trace.set_span_in_context(self._span))
            return
        if fields.propagated is None:
            fields.propagated = {}
            propagate.inject(fields.propagated, context=trace.set_span_in_context(self._span))
        headers.update(fields.propagated)

    def answered(self, status: int) -> None:
        if self._attributes is None:
            return
        self._span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._span.set_attribute("error.type", str(status))
            self._span.set_status(StatusCode.ERROR)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        metrics.provider_seconds(self._provider, self._endpoint).observe(
            time.perf_counter() - self._started
        )
        if self._attributes is None:
            return
        if exc_type is not None:
            # The class only: transport messages can quote the URL, arguments included.
            self._span.set_attribute("error.type", exc_type.__qualname__)
            self._span.set_status(StatusCode.ERROR)
        self._span.end()


def tool_call(
    provider: Provider, endpoint: Endpoint, call_id: str, operation_id: str | None
) -> ProviderCall:
    """The span of a forwarded call: ``execute_tool <tool>``, or ``dry_run``/``reconcile``."""
    fields = _fields.get()
    attempt = fields.attempt if fields is not None else None
    tool = attempt.tool if attempt is not None else None
    kind = "execute"
    if tool is not None and endpoint is tool.dry_run:
        kind = "dry_run"
    elif tool is not None and endpoint is tool.reconcile:
        kind = "reconcile"
    tool_name = tool.name if tool is not None else metrics.UNKNOWN_TOOL
    if fields is not None:
        fields.call_id = call_id
    name = "execute_tool" if kind == "execute" else kind
    if not trace.get_current_span().is_recording():
        return ProviderCall(f"{name} {tool_name}", provider.name, kind, None)
    attributes = _provider_attributes(provider, endpoint, kind)
    attributes["toolgate.call_id"] = call_id
    if kind == "execute":
        attributes["gen_ai.operation.name"] = "execute_tool"
        attributes["gen_ai.tool.name"] = tool_name
        attributes["gen_ai.tool.call.id"] = call_id
        attributes["gen_ai.tool.type"] = "function"
    else:
        attributes["toolgate.tool"] = tool_name
    if operation_id is not None:
        attributes["toolgate.operation_id"] = operation_id
    if attempt is not None:
        attributes["toolgate.policy_version"] = attempt.catalog.policy_version
        if attempt.run_id is not None:
            attributes["toolgate.run_id"] = attempt.run_id
    return ProviderCall(f"{name} {tool_name}", provider.name, kind, attributes)


def owner_lookup(provider: Provider, endpoint: Endpoint, resource_type: str) -> ProviderCall:
    """The span of an ownership lookup made while deciding a call."""
    name = f"owner_lookup {resource_type}"
    if not trace.get_current_span().is_recording():
        return ProviderCall(name, provider.name, "owner", None)
    attributes = _provider_attributes(provider, endpoint, "owner")
    attributes["toolgate.resource.type"] = resource_type
    fields = _fields.get()
    if fields is not None and fields.call_id is not None:
        attributes["toolgate.call_id"] = fields.call_id
    return ProviderCall(name, provider.name, "owner", attributes)


def _provider_attributes(provider: Provider, endpoint: Endpoint, kind: str) -> dict[str, Any]:
    return {
        "http.request.method": endpoint.method,
        "server.address": _host(provider.base_url),
        "toolgate.provider": provider.name,
        "toolgate.endpoint": kind,
    }


@lru_cache(maxsize=256)
def _host(base_url: str) -> str:
    return urlsplit(base_url).hostname or ""


class TelemetryMiddleware:
    """A SERVER span, the request-latency histogram and fresh ``RequestFields`` per request.

    Plain ASGI (no ``BaseHTTPMiddleware``): the route template is read from the scope after
    routing (``_route``), so span names and labels stay bounded (``POST /execute``).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method = scope["method"] if scope["method"] in _METHODS else "_OTHER"
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in _TRACE_HEADERS
        }
        parent = propagate.extract(carrier) if carrier else None
        span = _tracer.start_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        )
        otel_token = otel_context.attach(trace.set_span_in_context(span, parent))
        fields = RequestFields()
        fields_token = _fields.set(fields)
        status = 500
        error: str | None = None

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except BaseException as exc:
            error = type(exc).__qualname__
            raise
        finally:
            route = _route(scope)
            metrics.request_seconds(route or metrics.UNMATCHED_ROUTE, method, status).observe(
                time.perf_counter() - started
            )
            if span.is_recording():
                _describe(span, method, route, status, error, fields)
            span.end()
            _fields.reset(fields_token)
            otel_context.detach(otel_token)


def _route(scope: Scope) -> str | None:
    """The matched route's template: FastAPI's route, or the path of a plain Starlette route
    without path parameters (which is its own template); ``None`` when nothing matched."""
    route = scope.get("route")
    if route is not None:
        return getattr(route, "path", None)
    if "endpoint" in scope and not scope.get("path_params"):
        return str(scope["path"])
    return None


def _describe(
    span: trace.Span,
    method: str,
    route: str | None,
    status: int,
    error: str | None,
    fields: RequestFields,
) -> None:
    """A request span's closing attributes: route, status, correlation ids, error."""
    attributes: dict[str, Any] = {"http.response.status_code": status}
    if route is not None:
        span.update_name(f"{method} {route}")
        attributes["http.route"] = route
    if fields.call_id is not None:
        attributes["toolgate.call_id"] = fields.call_id
    if fields.run_id is not None:
        attributes["toolgate.run_id"] = fields.run_id
    if status >= 500 or error is not None:
        attributes["error.type"] = error or str(status)
        span.set_status(StatusCode.ERROR)
    span.set_attributes(attributes)
