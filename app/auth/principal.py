"""The verified identity behind a request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Principal:
    """Who the verified token says is calling; never built from request bodies."""

    sub: str
    tenant: str
    roles: frozenset[str]
    session_id: str | None = None

    def as_cel(self) -> dict[str, Any]:
        return {"sub": self.sub, "tenant": self.tenant, "roles": sorted(self.roles)}
