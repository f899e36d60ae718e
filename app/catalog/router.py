"""HTTP for GET /catalog."""

from __future__ import annotations

from fastapi import APIRouter

from app.catalog.listing import Format, Listing, listing
from app.deps import AUTHENTICATED, CurrentPrincipal, State
from app.responses import JSON, problems

router = APIRouter()


@router.get("/catalog", response_model=Listing, responses=problems(*AUTHENTICATED))
async def catalog(
    principal: CurrentPrincipal, state: State, format: Format = "raw", strict: bool = False
) -> JSON:
    return JSON(listing(state.catalog, principal, format, strict))
