"""Liveness and readiness: alive is the process; ready is catalog, database and Redis."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from app.deps import State
from app.errors import Unavailable
from app.responses import JSON, problem

router = APIRouter()


@router.get("/healthz")
async def healthz() -> JSON:
    return JSON({"status": "ok"})


@router.get("/readyz")
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
