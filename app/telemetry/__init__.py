"""Telemetry: OpenTelemetry traces, the counters of ``app.metrics`` and the decision log.

- ``tracing``: the tracer provider, set up once per process, exporting when configured.
- ``context``: the request's correlation ids, read by log lines and spans.
- ``decisions``: the hooks services report through (``bind_call``, ``decided``, ``executed``).
- ``provider_spans``: a CLIENT span and ``traceparent`` per provider request.
- ``middleware``: ``TelemetryMiddleware``, the SERVER span of every request.

Without an exporter (or a caller's sampled trace) spans are non-recording and provider calls
make none of their own: the ids still reach log lines and providers, and nothing is built
that nothing would read. Nothing here sees argument values.
"""

from app.telemetry.context import current_fields, current_span
from app.telemetry.decisions import bind_call, decided, executed
from app.telemetry.middleware import TelemetryMiddleware
from app.telemetry.provider_spans import ProviderCall, owner_lookup, tool_call
from app.telemetry.tracing import (
    FASTAPI_OFF,
    WhileExporting,
    add_span_processor,
    build_provider,
    flush,
    otlp_endpoint,
    setup,
)

__all__ = [
    "FASTAPI_OFF",
    "ProviderCall",
    "TelemetryMiddleware",
    "WhileExporting",
    "add_span_processor",
    "bind_call",
    "build_provider",
    "current_fields",
    "current_span",
    "decided",
    "executed",
    "flush",
    "otlp_endpoint",
    "owner_lookup",
    "setup",
    "tool_call",
]
