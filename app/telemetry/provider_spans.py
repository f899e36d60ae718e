"""Provider spans: one CLIENT span per provider request (``tool_call`` / ``owner_lookup``),
whose own context is what the provider receives as ``traceparent``. Execute calls carry the
OpenTelemetry GenAI ``execute_tool`` attributes. A request whose span is not recorded makes
no provider span of its own: the request's ids still reach the provider."""

from __future__ import annotations

import time
from functools import lru_cache
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, StatusCode

from app import metrics
from app.telemetry import tracing
from app.telemetry.context import current_span, request_fields

if TYPE_CHECKING:
    from app.catalog.models import Endpoint, Provider


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
            self._span = current_span()
        else:
            self._span = tracing.tracer.start_span(
                self._name, kind=SpanKind.CLIENT, attributes=self._attributes
            )
        self._started = time.perf_counter()
        return self

    def inject(self, headers: dict[str, str]) -> None:
        """Add ``traceparent`` naming this call's span, or else the request's, as the
        provider's parent. The request's is made once per request."""
        fields = request_fields.get() if self._attributes is None else None
        if fields is None:
            propagate.inject(headers, context=trace.set_span_in_context(self._span))
            return
        if fields.propagated is None:
            fields.propagated = tracing.carrier(self._span, fields.continued)
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
    fields = request_fields.get()
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
    if not current_span().is_recording():
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
    if not current_span().is_recording():
        return ProviderCall(name, provider.name, "owner", None)
    attributes = _provider_attributes(provider, endpoint, "owner")
    attributes["toolgate.resource.type"] = resource_type
    fields = request_fields.get()
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
