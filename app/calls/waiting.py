"""Waiting for a call to move on (GET /calls/{id}?wait=S), across instances.

Every change of a call's state is announced by PostgreSQL (``NOTIFY toolgate_calls``, sent by
a trigger when the change commits, so by whichever instance made it). Each process listens on
one connection and wakes the futures of its waiters on that call; a waiter then reads the call
once more. No waiter polls the database. When the listening connection drops, and again when
it is back, every waiter is woken to read again (a notification may have been missed), and a
waiter whose notification never comes still answers when its time is up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from app.db import Database
from app.errors import ToolgateError

CHANNEL = "toolgate_calls"
WAITING = frozenset({"awaiting_approval", "executing"})
"""States a call leaves without its actor's doing: a human decides, an execution finishes.
A proposed call whose next step is its dry-run waits too (``is_waiting``)."""
MAX_WAIT_S = 60.0
T = TypeVar("T")


def is_waiting(state: str, next_step: str | None) -> bool:
    return state in WAITING or (state == "proposed" and next_step == "dry_run")


class _Reading:
    """One call's readers: those queued for the next read, and the task reading for them."""

    __slots__ = ("queued", "reader")

    def __init__(self) -> None:
        self.queued: list[asyncio.Future[Any]] = []
        self.reader: asyncio.Task[None] | None = None


class CallWaiters:
    """The futures of this process's waiters, by call id, and the reads they share."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._reading: dict[str, _Reading] = {}
        self.listening = False
        """Whether every change is heard now: false until listening starts, and from a
        dropped connection until it is listening again (a change then goes unannounced)."""

    async def read_together(self, call_id: str, read: Callable[[], Awaitable[T]]) -> T:
        """``read()`` of ``call_id``, shared with the other requests that ask for the same
        call meanwhile, as group commit shares a commit: a request is answered by a read
        that began after it asked (so it sees every change committed before it asked,
        its own included), and all those that ask while one read runs share the next.
        Thousands of waiters woken by one change, or all answering at once, cost two reads,
        not thousands queued for the pool. Every reader of one call reads the same thing
        (``read`` of the first is used); an error reaches each as an instance of its own."""
        reading = self._reading.get(call_id)
        if reading is None:
            reading = self._reading[call_id] = _Reading()
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        reading.queued.append(done)
        if reading.reader is None:
            reading.reader = asyncio.create_task(self._read(call_id, reading, read))
        return await done

    async def _read(
        self, call_id: str, reading: _Reading, read: Callable[[], Awaitable[Any]]
    ) -> None:
        group: list[asyncio.Future[Any]] = []
        try:
            while reading.queued:
                group, reading.queued = reading.queued, []
                try:
                    value = await read()
                except Exception as exc:
                    for done in group:
                        if not done.done():
                            done.set_exception(_own(exc))
                else:
                    for done in group:
                        if not done.done():
                            done.set_result(value)
        finally:
            for done in (*group, *reading.queued):  # cancelled: the app is stopping
                if not done.done():
                    done.cancel()
            del self._reading[call_id]

    async def listen(self, db: Database) -> None:
        """The lifespan's task: wake waiters as their calls change, until cancelled."""
        await db.listen(CHANNEL, self._changed, self._gap)

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

    def _gap(self, listening: bool) -> None:
        """Listening (re)started or stopped: a notification may have been missed, so every
        waiter reads again."""
        self.listening = listening
        for call_id in list(self._waiters):
            self._changed(call_id)


def _own(error: Exception) -> Exception:
    """A ``ToolgateError`` copied for one request (a handler may add to its members, which
    must not reach another request's answer); any other error as it is."""
    if isinstance(error, ToolgateError):
        copy = type(error)(error.detail, **error.extra)
        copy.__cause__ = error.__cause__
        return copy
    return error
