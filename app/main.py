"""The application: ``create_app(settings)`` and a lifespan that opens everything it needs.

Nothing connects at import time. Startup fails (and the process exits) on an invalid
catalog, unusable keys, an unreachable or unmigrated database.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import exposition, health, metrics, openapi, retention, telemetry
from app.approvals import router as approvals
from app.audit import router as audit
from app.audit import sealer as audit_sealer
from app.auth.oidc import Discovery
from app.auth.tokens import TokenVerifier
from app.calls import reconciler
from app.calls import router as calls
from app.calls.waiting import CallWaiters
from app.catalog import router as catalog
from app.catalog.loader import CatalogError, load
from app.console import apidocs
from app.console import router as console
from app.console.cors import CrossOrigin, error_headers
from app.db import Database, pending_migrations
from app.deps import malformed
from app.errors import ContentTooLarge, InvalidRequest, NotFound, ToolgateError, Unavailable
from app.known import router as known
from app.locks import Locks
from app.mcp import router as mcp
from app.outbound import Outbound
from app.providers import ProviderClient
from app.responses import CLIENT_GONE, JSON, problem
from app.routing import operation_id
from app.runs import router as runs
from app.settings import ConfigError, Settings
from app.state import AppState
from app.webhooks import sender as webhooks

MAX_BODY_BYTES = 1 << 20
"""Every request body, on every route: far above any tool call's arguments."""
GC_THRESHOLD = 20_000
"""Young-generation collections after this many allocations (CPython's default: 700); a
request allocates thousands of short-lived objects, and most die before any collection."""
log = logging.getLogger("toolgate")


async def open_state(settings: Settings) -> AppState:
    """Everything a request needs, or ``ConfigError`` saying why it cannot start."""
    catalog = load(settings.catalog_path, settings.env)
    for warning in catalog.warnings:
        log.warning("catalog: %s", warning)
    url = settings.check_database()
    pending = await pending_migrations(url)
    if pending:
        raise ConfigError(
            f"the database schema is not at the latest migration (pending: {', '.join(pending)});"
            " run `toolgate migrate`"
        )
    outbound = Outbound()
    verifier = TokenVerifier(settings, outbound)
    db = Database(url)
    await db.open()
    locks = Locks(settings.redis_url, settings.redis_prefix, url)
    try:
        await locks.open()
    except Unavailable:
        await db.close()
        raise
    await outbound.start()
    return AppState(
        settings=settings,
        catalog=catalog,
        db=db,
        providers=ProviderClient(outbound),
        outbound=outbound,
        verifier=verifier,
        locks=locks,
        waiters=CallWaiters(),
        discovery=Discovery(settings, outbound),
    )


async def close_state(state: AppState) -> None:
    await state.db.close()
    await state.outbound.close()
    await state.locks.close()


async def reload_catalog(state: AppState) -> None:
    """Swap in the catalog as it is on disk now; a broken one leaves the current in place.
    Reloads take turns: two at once (two SIGHUPs) would each read the disk, and the slower
    one, which may have read the older file, would swap its catalog in last."""
    settings = state.settings
    async with state.reloading:
        outcome = "refused"
        try:
            state.catalog = await asyncio.to_thread(load, settings.catalog_path, settings.env)
        except CatalogError as exc:
            log.error("catalog reload refused, keeping %s:\n%s", state.catalog.policy_version, exc)
        except Exception:  # a loader bug must not end the reload unheard, nor change the policy
            log.exception("catalog reload refused, keeping %s", state.catalog.policy_version)
        else:
            outcome = "reloaded"
            log.info("catalog reloaded: %s", state.catalog.policy_version)
        metrics.CATALOG_RELOADS.labels(outcome).inc()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state = await open_state(app.state.settings)
    app.state.toolgate = state
    gc.freeze()  # start-up objects (catalog, schemas, modules) are never collected again
    gc.set_threshold(GC_THRESHOLD)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = {
        asyncio.create_task(retention.run(state.db, state.settings)),
        asyncio.create_task(reconciler.run(state)),
        asyncio.create_task(state.waiters.listen(state.db)),
        asyncio.create_task(webhooks.run(state)),
    }
    if app.state.seal_in_lifespan:
        tasks.add(audit_sealer.start(state.db, state.settings))

    def on_sighup() -> None:
        task = asyncio.create_task(reload_catalog(state))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    try:
        async with app.state.mcp.running():
            yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        for task in tasks:
            task.cancel()
        # Each ends here, its cancellation handled once: a task still running when the loop
        # closes is cancelled again, perhaps while it rolls back.
        await asyncio.gather(*tasks, return_exceptions=True)
        await close_state(state)
        await telemetry.flush()


class RequestLimits:
    """ASGI, on every route: what no request may carry, refused as a problem before any
    endpoint runs, and nothing recorded.

    - A body over ``MAX_BODY_BYTES``: 413 ``invalid_request``. A declared ``Content-Length``
      over it is answered at once; a longer body without one fails its read, which the app's
      handlers turn into the same problem.
    - NUL in the path or the query: path and query values are looked up in PostgreSQL, whose
      text cannot hold it, and URLs are decoded with replacement characters, so NUL is the one
      thing that does not fit. In the path it names nothing (404 ``not_found``); in the query
      it is malformed (400 ``invalid_request``).
    - An encoded slash (``%2F``) in the path: routes match the decoded path, where it would
      be a separator, so ``/runs/X%2Ffinish`` would finish run X while a proxy in front saw
      one path segment. No id holds a slash: it names nothing (404 ``not_found``).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = _refusal(scope)
        if refusal is not None:
            metrics.refusals(metrics.UNMATCHED_ROUTE, refusal.code).inc()
            await problem(refusal)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES:
                raise _too_large()
            return message

        await self.app(scope, counted, send)


def _refusal(scope: Scope) -> ToolgateError | None:
    for name, value in scope["headers"]:
        if name == b"content-length" and _over_limit(value):
            return _too_large()
    if "\x00" in scope["path"] or b"%2f" in scope.get("raw_path", b"").lower():
        return NotFound("no such resource")
    query: bytes = scope["query_string"]
    if b"%00" in query or b"\x00" in query:
        return InvalidRequest("a query parameter holds a NUL character")
    return None


def _over_limit(length: bytes) -> bool:
    """Whether a declared ``Content-Length`` exceeds ``MAX_BODY_BYTES``. The HTTP server
    passes leading zeros through, and ``int`` refuses thousands of digits: a long value is
    judged by its significant digits' count."""
    if not length.isdigit():
        return False  # not a length at all: the HTTP server refuses the request
    digits = length.lstrip(b"0")
    return len(digits) > len(str(MAX_BODY_BYTES)) or int(digits or b"0") > MAX_BODY_BYTES


def _too_large() -> ToolgateError:
    return ContentTooLarge(f"the request body is larger than {MAX_BODY_BYTES} bytes")


def refused(request: Request, error: ToolgateError) -> JSON:
    """The problem answering ``error``, counted by route and code (``toolgate_refusals``):
    a refusal that no decision records, such as a malformed body, is recorded there."""
    metrics.refusals(metrics.route_template(request.scope), error.code).inc()
    return problem(error)


def unexpected(headers: dict[str, str] | None = None) -> JSON:
    """The answer to an exception nothing expected: a 500 problem, never a plain-text body,
    and nothing of the exception in it."""
    return problem(ToolgateError("an unexpected error occurred; it has been logged"), headers)


class Toolgate(FastAPI):
    """FastAPI, whose OpenAPI document is ``app.openapi.document``."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = openapi.document(self)
        return self.openapi_schema


def create_app(settings: Settings, *, sealer: bool = True) -> FastAPI:
    """``sealer=False``: audit rows are sealed elsewhere (``toolgate serve``'s own process).

    One pipeline for every route, the decision endpoints included (they are FastAPI routes of
    the class ``app.routing.DecisionRoute``), and for anything mounted later: Starlette's
    error middleware, then, from the outside in, cross-origin access (when configured),
    telemetry and the request limits, then the exception handlers and the router."""
    telemetry.setup(settings.env)
    app = Toolgate(
        title="toolgate",
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url=None,  # ``app.console.apidocs`` serves /docs without a CDN
        redoc_url=None,
        generate_unique_id_function=operation_id,
        telemetry=telemetry.FASTAPI_OFF,
    )
    app.state.settings = settings
    app.state.seal_in_lifespan = sealer
    app.add_middleware(RequestLimits)
    app.add_middleware(telemetry.TelemetryMiddleware)
    if settings.cors_origins:
        app.add_middleware(CrossOrigin, origins=settings.cors_origins)
    # The decision endpoints are the first routes of the app's own router: an included router's
    # routes are matched through two more levels (twice) on every request, which cost a read
    # more CPU than the rest of the stack. Nothing else differs: a decision router has no
    # prefix or dependencies of its own.
    app.router.routes[0:0] = [*calls.decisions.routes, *approvals.decisions.routes]
    app.include_router(calls.router)
    app.include_router(approvals.router)
    app.include_router(runs.router)
    app.include_router(known.router)
    app.include_router(catalog.router)
    app.include_router(audit.router)
    app.include_router(health.router)
    app.include_router(exposition.router)
    app.include_router(console.router)
    app.include_router(apidocs.router)
    app.state.mcp = mcp.Endpoint()
    app.router.routes.extend(mcp.routes(app.state.mcp))

    @app.exception_handler(ToolgateError)
    async def on_toolgate_error(request: Request, error: ToolgateError) -> Any:
        return refused(request, error)

    @app.exception_handler(ClientDisconnect)
    async def on_client_gone(request: Request, error: ClientDisconnect) -> Any:
        """The client closed the connection before its body had arrived."""
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(RequestValidationError)
    async def on_invalid_body(request: Request, error: RequestValidationError) -> Any:
        errors = error.errors()
        body = all(e["loc"][:1] == ("body",) for e in errors)
        return refused(
            request, malformed(errors, skip=1, what="the request body" if body else "the request")
        )

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, error: Exception) -> Any:
        return unexpected(error_headers(settings.cors_origins, request.headers.get("origin")))

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, error: HTTPException) -> Any:
        if error.status_code == 404:
            return refused(request, NotFound("no such endpoint"))
        metrics.refusals(metrics.route_template(request.scope), InvalidRequest.code).inc()
        body = {**InvalidRequest(str(error.detail)).problem(), "status": error.status_code}
        return JSON(
            body,
            status_code=error.status_code,
            headers=error.headers,  # a 405's Allow
            media_type="application/problem+json",
        )

    return app


def serve_app() -> FastAPI:
    """Factory for ``toolgate serve``'s uvicorn workers: settings from the environment, and
    sealing left to the sealer process ``serve`` runs beside them."""
    return create_app(Settings.from_env(), sealer=False)
