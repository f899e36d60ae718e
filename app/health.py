"""Liveness and readiness: alive is the process; ready is catalog, database and Redis."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter
from typing_extensions import TypedDict

from app.deps import State
from app.errors import Unavailable
from app.responses import JSON, problem, problems

router = APIRouter()


class Alive(TypedDict):
    status: Literal["ok"]


class Ready(TypedDict):
    """``checks``: the catalog's policy version, and ``ok`` or ``unreachable`` for the
    database and Redis (the same in the 503 problem when one is unreachable)."""

    status: Literal["ready"]
    checks: dict[str, str]


@router.get("/healthz", response_model=Alive, responses=problems())
async def healthz() -> JSON:
    return JSON({"status": "ok"})


@router.get("/readyz", response_model=Ready, responses=problems(Unavailable))
async def readyz(state: State) -> JSON:
    database, redis = await asyncio.gather(state.db.ping(), state.locks.ping())
    checks = {
        "catalog": state.catalog.policy_version,
        "database": "ok" if database else "unreachable",
        "redis": "ok" if redis else "unreachable",
    }
    if not (database and redis):
        return problem(Unavailable("a dependency is unreachable", checks=checks))
    return JSON({"status": "ready", "checks": checks})
