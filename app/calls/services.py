"""What the call use cases use of the app: ``Services``, the part of ``AppState`` that
deciding, running and showing a call may reach. Not the token verifier (a use case is
given its principal, verified), the OIDC discovery, the webhook sender or the reload lock.
Helpers below the use cases take only the one or two of these they use."""

from __future__ import annotations

from typing import Protocol

from app.calls.waiting import CallWaiters
from app.catalog.models import Catalog
from app.db import Database
from app.locks import Locks
from app.providers import ProviderClient
from app.runs.endorsement import TrustedTexts
from app.runs.service import OwnRuns
from app.settings import Settings


class Services(Protocol):
    """Each part as ``AppState`` documents it."""

    settings: Settings
    catalog: Catalog
    db: Database
    providers: ProviderClient
    locks: Locks
    trusted: TrustedTexts
    own_runs: OwnRuns
    waiters: CallWaiters
