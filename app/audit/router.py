"""HTTP for the audit trail: GET /audit, /audit/export (NDJSON) and /audit/verify."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from app.audit import service
from app.audit.models import AuditFilter, AuditPage, Event, Verification
from app.bodies import ID_PATTERN
from app.deps import AUTHENTICATED, CurrentPrincipal, State
from app.errors import Forbidden, InvalidRequest
from app.responses import CLIENT_GONE, JSON, problems

router = APIRouter(responses=problems(*AUTHENTICATED, Forbidden))

RFC3339 = r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
_RFC3339 = re.compile(RFC3339)
Instant = Annotated[str | None, Query(pattern=RFC3339)]
"""A date-time in the query, documented as the form ``_instant`` takes."""


def _instant(name: str, value: str | None) -> datetime | None:
    """The query's date-time as a UTC instant. Its offset may carry a date of year 1 or 9999
    out of what a datetime (and so the database facade) can hold: that is bad input too."""
    if value is None:
        return None
    if not _RFC3339.fullmatch(value):
        raise InvalidRequest(f"{name} must be an RFC 3339 date-time with an offset")
    try:
        return datetime.fromisoformat(value.upper()).astimezone(UTC)
    except (ValueError, OverflowError):
        raise InvalidRequest(f"{name} is not a valid date-time") from None


QueryId = Annotated[str | None, Query(pattern=ID_PATTERN)]
"""A call or run id to filter by: given empty, it is malformed, not "any"."""
FILTERS = ("tenant", "actor", "tool", "call_id", "run_id", "event", "since", "until")


def _only(request: Request, *names: str) -> None:
    """Refuse a query parameter the endpoint does not know, or one given twice: a misspelt
    filter (``tenat=acme``) would otherwise widen the listing to every row the caller may
    read, and a repeated one be read differently by a proxy in front."""
    given = [name for name, _ in request.query_params.multi_items()]
    unknown = sorted(set(given) - {*FILTERS, *names})
    if unknown:
        raise InvalidRequest(f"unknown query parameter {unknown[0]!r}")
    if len(given) != len(set(given)):
        raise InvalidRequest("a query parameter is given more than once")


async def audit_filter(
    tenant: str | None = None,
    actor: str | None = None,
    tool: str | None = None,
    call_id: QueryId = None,
    run_id: QueryId = None,
    event: Event | None = None,
    since: Instant = None,
    until: Instant = None,
) -> AuditFilter:
    """The filters of docs/api.md from the query; ``since`` inclusive, ``until`` exclusive."""
    return AuditFilter(
        tenant=tenant,
        actor=actor,
        tool=tool,
        call_id=call_id,
        run_id=run_id,
        event=event,
        since=_instant("since", since),
        until=_instant("until", until),
    )


Filter = Annotated[AuditFilter, Depends(audit_filter)]


@router.get("/audit", response_model=AuditPage)
async def audit_page(
    principal: CurrentPrincipal,
    state: State,
    where: Filter,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: str | None = None,
) -> JSON:
    _only(request, "limit", "cursor")
    return JSON(await service.page(state.db, state.settings, principal, where, limit, cursor))


@router.get(
    "/audit/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "NDJSON: one `AuditItem` per line, as `GET /audit` lists them",
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
        }
    },
)
async def audit_export(
    request: Request,
    principal: CurrentPrincipal,
    state: State,
    where: Filter,
    cursor: str | None = None,
) -> StreamingResponse:
    _only(request, "cursor")
    lines = await service.export(state.db, state.settings, principal, where, cursor)
    return StreamingResponse(lines, media_type="application/x-ndjson")


@router.get("/audit/verify", response_model=Verification)
async def audit_verify(request: Request, principal: CurrentPrincipal, state: State) -> Response:
    # Stopped when the client leaves: verifying a long chain for nobody would hold a
    # connection, retention's cuts and a share of this worker for minutes.
    verifying = asyncio.ensure_future(service.verify_for(state.db, state.settings, principal))
    leaving = asyncio.ensure_future(_left(request))
    try:
        await asyncio.wait((verifying, leaving), return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
        verifying.cancel()  # nothing, once it is done
    try:
        report = await verifying
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():  # this request itself is stopping
            raise
        return Response(status_code=CLIENT_GONE)
    return JSON(report.as_dict())


async def _left(request: Request) -> None:
    """Returns once the client has disconnected (a GET's request carries no body to read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
