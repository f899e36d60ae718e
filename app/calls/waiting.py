"""Waiting for a call to move on (GET /calls/{id}?wait=S), across instances.

Every change of a call's state is announced by PostgreSQL (``NOTIFY toolgate_calls``, sent by
a trigger when the change commits, so by whichever instance made it). Each process listens on
one connection and wakes the futures of its waiters on that call; a waiter then reads the call
once more. No waiter polls the database. While the listening connection is down, every waiter
is woken to read again (a notification may have been missed), and a waiter whose
notification never comes still answers when its time is up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from app.db import Database

CHANNEL = "toolgate_calls"
WAITING = frozenset({"awaiting_approval", "executing"})
"""States a call leaves without its actor's doing: a human decides, an execution finishes.
A proposed call whose next step is its dry-run waits too (``is_waiting``)."""
MAX_WAIT_S = 60.0


def is_waiting(state: str, next_step: str | None) -> bool:
    return state in WAITING or (state == "proposed" and next_step == "dry_run")


class CallWaiters:
    """The futures of this process's waiters, by call id."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    async def listen(self, db: Database) -> None:
        """The lifespan's task: wake waiters as their calls change, until cancelled."""
        await db.listen(CHANNEL, self._changed, self._wake_all)

    @contextlib.asynccontextmanager
    async def watching(self, call_id: str) -> AsyncIterator[asyncio.Future[None]]:
        """A future done at the next change of ``call_id``'s state. Registered before the
        caller reads the call, so a change between that read and the wait is not missed."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(call_id, set()).add(future)
        try:
            yield future
        finally:
            waiters = self._waiters.get(call_id)
            if waiters is not None:
                waiters.discard(future)
                if not waiters:
                    del self._waiters[call_id]

    def _changed(self, call_id: str) -> None:
        for future in self._waiters.get(call_id, ()):
            if not future.done():
                future.set_result(None)

    def _wake_all(self) -> None:
        for call_id in list(self._waiters):
            self._changed(call_id)
