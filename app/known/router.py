"""HTTP for known values: admins add, remove and list them, per kind."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from app.deps import AUTHENTICATED, CurrentPrincipal, State
from app.errors import Forbidden, NotFound
from app.known import service
from app.known.models import Forgotten, KnownPage, KnownValue
from app.responses import JSON, problems

router = APIRouter()
Kind = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_.-]{0,99}$")]
"""A kind as the catalog names it (``x-endorsed-kind``, or ``<tool>.<argument>``)."""
Value = Annotated[str, Path(min_length=1, max_length=1000)]


@router.put(
    "/known-values/{kind}/{value:path}",
    response_model=KnownValue,
    responses=problems(*AUTHENTICATED, Forbidden, NotFound),
)
async def put_known_value(
    kind: Kind, value: Value, principal: CurrentPrincipal, state: State
) -> JSON:
    """Vouch for ``value`` as a ``kind`` for the admin's whole tenant (a slash in it is part
    of it)."""
    return JSON(
        await service.put(
            state.db,
            state.settings.known_values_keys,
            state.catalog,
            state.settings.admin_role,
            principal,
            kind,
            value,
        )
    )


@router.delete(
    "/known-values/{kind}/{value:path}",
    response_model=Forgotten,
    responses=problems(*AUTHENTICATED, Forbidden, NotFound),
)
async def delete_known_value(
    kind: Kind, value: Value, principal: CurrentPrincipal, state: State
) -> JSON:
    settings = state.settings
    return JSON(
        await service.delete(
            state.db, settings.known_values_keys, settings.admin_role, principal, kind, value
        )
    )


@router.get(
    "/known-values/{kind}",
    response_model=KnownPage,
    responses=problems(*AUTHENTICATED, Forbidden, NotFound),
)
async def list_known_values(
    kind: Kind, principal: CurrentPrincipal, state: State, cursor: str | None = None
) -> JSON:
    return JSON(await service.listing(state.db, state.settings.admin_role, principal, kind, cursor))
