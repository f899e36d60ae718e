"""HTTP for GET /catalog."""

from __future__ import annotations

from fastapi import APIRouter

from app.catalog.listing import Format, listing
from app.deps import CurrentPrincipal, State
from app.responses import JSON

router = APIRouter()


@router.get("/catalog")
async def catalog(
    principal: CurrentPrincipal, state: State, format: Format = "raw", strict: bool = False
) -> JSON:
    return JSON(listing(state.catalog, principal, format, strict))
