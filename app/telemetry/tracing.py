"""The tracer provider: set up once per process, exporting OTLP/HTTP when configured.

A request span is always created, so trace ids propagate; spans leave the process only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set, through a
``BatchSpanProcessor`` whose exporter thread keeps network I/O off the event loop, sampled as
``OTEL_TRACES_SAMPLER`` says. Until a span processor is installed spans are non-recording
(``WhileExporting``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi.telemetry import TelemetryConfig
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

DEFAULT_SERVICE_NAME = "toolgate"
FASTAPI_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""For ``FastAPI(telemetry=...)``: its built-in spans would duplicate ``TelemetryMiddleware``'s
and add two per request (dependencies, endpoint); its metrics would need an OTel meter."""
tracer: trace.Tracer = trace.get_tracer("toolgate")
"""The process's tracer, once ``setup`` has run: request and provider spans start here."""
_idle: tuple[WhileExporting, IdGenerator] | None = None
"""The sampler and id generator of ``setup``'s provider, when it samples ``WhileExporting``."""
_PROBES = tuple(
    SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(f))
    for f in (TraceFlags.DEFAULT, TraceFlags.SAMPLED)
)
_plain: tuple[TextMapPropagator, bool] | None = None
"""The propagator last probed by ``_traceparent_only``, and its answer."""


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
    global tracer, _idle
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = build_provider(env)
        trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("toolgate")
    _idle = None
    if isinstance(provider, TracerProvider) and isinstance(provider.sampler, WhileExporting):
        _idle = (provider.sampler, provider.id_generator)


def server_span(name: str, parent: Context | None, attributes: dict[str, Any]) -> trace.Span:
    """A request's SERVER span. Without a caller's trace and with nothing exporting, it is
    the non-recording span the sampler would make, made directly: the common case skips the
    SDK's sampling and span machinery."""
    if parent is None and _idle is not None and not _idle[0].exporting:
        ids = _idle[1]
        return NonRecordingSpan(
            SpanContext(ids.generate_trace_id(), ids.generate_span_id(), is_remote=False)
        )
    return tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


def carrier(span: trace.Span, continued: bool) -> dict[str, str]:
    """The headers that carry ``span`` to a provider, as the configured propagators write
    them. A request that ``continued`` no caller's context holds no baggage, and its span
    usually no trace state; while the propagators write only ``traceparent`` for such a
    span (the default ``tracecontext,baggage`` does), that header is formatted here
    directly, without the SDK's context and propagator calls."""
    ids = span.get_span_context()
    if not continued and ids.is_valid and not ids.trace_state and _traceparent_only():
        return {"traceparent": _traceparent(ids)}
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span))
    return headers


def _traceparent(ids: SpanContext) -> str:
    return f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"


def _traceparent_only() -> bool:
    """Whether the global propagator writes exactly W3C's ``traceparent`` for a span in an
    otherwise empty context: probed once per propagator, sampled and not."""
    global _plain
    textmap = propagate.get_global_textmap()
    if _plain is None or _plain[0] is not textmap:
        written = []
        for probe in _PROBES:
            headers: dict[str, str] = {}
            textmap.inject(headers, trace.set_span_in_context(NonRecordingSpan(probe), Context()))
            written.append(headers == {"traceparent": _traceparent(probe)})
        _plain = (textmap, all(written))
    return _plain[1]


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
