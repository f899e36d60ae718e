"""The lock facade: short-lived, owner-checked locks, in Redis or in PostgreSQL.

Locks only keep instances from doing the same work at once; PostgreSQL stays the source of
truth and providers deduplicate on the operation id, so an expired or lost lock never
causes a second side effect. A lock service failure raises ``Unavailable``: mutations fail
closed.

Without ``TOOLGATE_REDIS_URL`` the locks are PostgreSQL session advisory locks, which every
process on the database respects (several workers, several instances): a lock is a
``pg_try_advisory_lock`` on a connection held for as long as the lock, released with
``pg_advisory_unlock`` before that connection goes back to its pool (pooled connections are
not reset, ``app.db``); if the unlock fails the connection is closed, which releases it too,
as does the end of a process that dies holding one. These connections come from a small
pool of their own: a lock holder also needs a connection for its work, and drawing both
from one pool could leave every connection held by a holder waiting for another. The TTL
does not apply: the lock lasts until released or until its holder's connection ends.

A command that fails with a connection error is sent once more on a fresh connection: after a
Redis restart every pooled connection is dead, and without this the first request each one
serves would fail. Only connection errors are retried, and only once, so Redis really being
down still answers at once. A lock request that did land before its connection broke makes
the second try find the key taken: the caller answers "in flight", never runs twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as Disconnected
from redis.exceptions import RedisError

from app.db import Database
from app.errors import Unavailable

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


POOL_SIZE = 10
"""Advisory locks held at once per process; more holders wait for a connection."""
TIMEOUT_S = 2.0
"""How long a connection to Redis, or one command on it, may take: a lock is one short
command, and a Redis that stops answering (hung, or its route dropped) must make a request
fail closed at once rather than wait as long as the kernel keeps a connection."""


class Locks:
    """Redis locks when ``redis_url`` is given, else advisory locks on ``database_url``."""

    def __init__(self, redis_url: str | None, prefix: str, database_url: str) -> None:
        reconnect = Retry(NoBackoff(), retries=1, supported_errors=(Disconnected,))
        self._redis = (
            redis.Redis.from_url(
                redis_url,
                retry=reconnect,
                socket_timeout=TIMEOUT_S,
                socket_connect_timeout=TIMEOUT_S,
            )
            if redis_url
            else None
        )
        self._release_script = self._redis.register_script(_RELEASE) if self._redis else None
        self._prefix = prefix
        self._db = None if self._redis else Database(database_url)

    @property
    def backend(self) -> str:
        return "redis" if self._redis is not None else "postgres"

    async def open(self) -> None:
        if self._db is not None:
            await self._db.open(min_size=1, max_size=POOL_SIZE)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
        if self._db is not None:
            await self._db.close()

    async def ping(self) -> bool:
        if self._db is not None:
            return await self._db.ping()
        assert self._redis is not None
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    @asynccontextmanager
    async def hold(self, name: str, ttl_s: float) -> AsyncIterator[bool]:
        """Try once to take ``name`` for ``ttl_s``; yields whether this caller holds it."""
        if self._db is not None:
            async with self._advisory(name) as held:
                yield held
            return
        token = secrets.token_hex(8)
        key = f"{self._prefix}lock:{name}"
        held = await self._acquire(key, token, ttl_s)
        try:
            yield held
        finally:
            if held:
                await self._release(key, token)

    @asynccontextmanager
    async def _advisory(self, name: str) -> AsyncIterator[bool]:
        assert self._db is not None
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        async with self._db.exclusively(key) as held:
            yield held

    async def _acquire(self, key: str, token: str, ttl_s: float) -> bool:
        assert self._redis is not None
        try:
            return bool(await self._redis.set(key, token, nx=True, px=int(ttl_s * 1000)))
        except (RedisError, OSError) as exc:
            raise Unavailable("the lock service is unavailable") from exc

    async def _release(self, key: str, token: str) -> None:
        assert self._release_script is not None
        with contextlib.suppress(RedisError, OSError):  # it expires by itself anyway
            await self._release_script(keys=[key], args=[token])  # EVALSHA, loaded once
