"""The request's correlation ids (``RequestFields``), for every log line and span it makes.

``TelemetryMiddleware`` gives each request fresh fields; the decision hooks and provider
spans fill them in as the call is decided.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from opentelemetry import trace

if TYPE_CHECKING:
    from app.catalog.models import Catalog, Tool


class CallAttempt(Protocol):
    """What telemetry reads of the call being decided (``app.calls.models.Request``, or the
    ``Authorized`` result of its authorization)."""

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

    __slots__ = ("attempt", "call_id", "continued", "propagated", "run_id", "span")

    def __init__(self, span: trace.Span = trace.INVALID_SPAN, *, continued: bool = False) -> None:
        self.span = span
        """The request's SERVER span. Only a recorded one is also OpenTelemetry's current
        span (the parent of provider spans); the ids of any reach log lines and providers
        from here."""
        self.continued = continued
        """Whether the request carried a caller's trace context (``traceparent``,
        ``tracestate`` or ``baggage``)."""
        self.call_id: str | None = None
        self.run_id: str | None = None
        self.attempt: CallAttempt | None = None
        self.propagated: dict[str, str] | None = None
        """The request span's ``traceparent`` (and ``tracestate``), once made."""


request_fields: ContextVar[RequestFields | None] = ContextVar(
    "toolgate_request_fields", default=None
)


def current_fields() -> RequestFields | None:
    return request_fields.get()


def current_span() -> trace.Span:
    """The request's span, or OpenTelemetry's current one outside a request."""
    fields = request_fields.get()
    return fields.span if fields is not None else trace.get_current_span()
