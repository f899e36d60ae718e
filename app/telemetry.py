"""OpenTelemetry wiring: a tracer provider at start, ``traceparent`` on outbound calls."""

from __future__ import annotations

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider

tracer = trace.get_tracer("toolgate")


def setup() -> None:
    """Install the SDK tracer provider once, so spans carry real, propagatable ids."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())


def inject_trace(headers: dict[str, str]) -> None:
    propagate.inject(headers)
