"""``TelemetryMiddleware``: the SERVER span, the request-latency histogram and fresh
``RequestFields`` of every request, continuing an incoming ``traceparent``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import StatusCode

from app import metrics
from app.telemetry import tracing
from app.telemetry.context import RequestFields, request_fields

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate", b"baggage"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]


class TelemetryMiddleware:
    """A SERVER span, the request-latency histogram and fresh ``RequestFields`` per request.

    Plain ASGI (no ``BaseHTTPMiddleware``): the route template is read from the scope after
    routing (``metrics.route_template``), so span names and labels stay bounded (``POST /execute``).
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
        span = tracing.server_span(
            method, parent, {"http.request.method": method, "url.path": scope["path"]}
        )
        otel_token = None
        if parent is not None or span.is_recording():  # else nothing reads OTel's context
            otel_token = otel_context.attach(trace.set_span_in_context(span, parent))
        fields = RequestFields(span, continued=parent is not None)
        fields_token = request_fields.set(fields)
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
            route = metrics.route_template(scope)
            metrics.request_seconds(route, method, status).observe(time.perf_counter() - started)
            if span.is_recording():
                _describe(span, method, route, status, error, fields)
            span.end()
            request_fields.reset(fields_token)
            if otel_token is not None:
                otel_context.detach(otel_token)


def _describe(
    span: trace.Span,
    method: str,
    route: str,
    status: int,
    error: str | None,
    fields: RequestFields,
) -> None:
    """A request span's closing attributes: route, status, correlation ids, error."""
    attributes: dict[str, Any] = {"http.response.status_code": status}
    if route != metrics.UNMATCHED_ROUTE:
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
