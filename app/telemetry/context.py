"""The request's correlation ids (``RequestFields``), for every log line and span it makes.

``TelemetryMiddleware`` gives each request fresh fields; the decision hooks and provider
spans fill them in as the call is decided.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

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

    __slots__ = ("attempt", "call_id", "propagated", "run_id")

    def __init__(self) -> None:
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
