"""What the lifespan opens and every request uses, as one typed object."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from app.auth.oidc import Discovery
from app.auth.tokens import TokenVerifier
from app.calls.waiting import CallWaiters
from app.catalog.models import Catalog
from app.db import Database
from app.locks import Locks
from app.outbound import Outbound
from app.providers import ProviderClient
from app.runs.endorsement import TrustedTexts
from app.runs.service import OwnRuns
from app.settings import Settings


@dataclass
class AppState:
    settings: Settings
    catalog: Catalog
    """Replaced whole on reload; a request reads it once and keeps that version."""
    db: Database
    providers: ProviderClient
    outbound: Outbound
    verifier: TokenVerifier
    locks: Locks
    waiters: CallWaiters
    """This process's waiters on calls (``GET /calls/{id}?wait=S``)."""
    discovery: Discovery
    """The OpenID provider the console signs approvers in with, if one is configured."""
    trusted: TrustedTexts = field(default_factory=TrustedTexts)
    """The trusted results of the runs this process judged last (to endorse values by)."""
    own_runs: OwnRuns = field(default_factory=OwnRuns)
    """The runs this process has found to be whose (their owners never change)."""
    reloading: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by a catalog reload (``main.reload_catalog``) from reading the disk to swapping
    the catalog in: reloads take turns."""
