"""The Redis facade: short-lived, owner-checked locks.

Redis only keeps instances from doing the same work at once; PostgreSQL stays the source of
truth and providers deduplicate on the operation id, so an expired or lost lock never
causes a second side effect. Without ``TOOLGATE_REDIS_URL`` the locks are in-process (one
node only). A Redis failure raises ``Unavailable``: mutations fail closed.

A command that fails with a connection error is sent once more on a fresh connection: after a
Redis restart every pooled connection is dead, and without this the first request each one
serves would fail. Only connection errors are retried, and only once, so Redis really being
down still answers at once. A lock request that did land before its connection broke makes
the second try find the key taken: the caller answers "in flight", never runs twice.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as Disconnected
from redis.exceptions import RedisError

from app.errors import Unavailable

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class Locks:
    def __init__(self, url: str | None, prefix: str) -> None:
        reconnect = Retry(NoBackoff(), retries=1, supported_errors=(Disconnected,))
        self._redis = redis.Redis.from_url(url, retry=reconnect) if url else None
        self._release_script = self._redis.register_script(_RELEASE) if self._redis else None
        self._prefix = prefix
        self._local: dict[str, tuple[str, float]] = {}

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def ping(self) -> bool:
        """Reachable, or configured for in-process locks only."""
        if self._redis is None:
            return True
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    @asynccontextmanager
    async def hold(self, name: str, ttl_s: float) -> AsyncIterator[bool]:
        """Try once to take ``name`` for ``ttl_s``; yields whether this caller holds it."""
        token = secrets.token_hex(8)
        key = f"{self._prefix}lock:{name}"
        held = await self._acquire(key, token, ttl_s)
        try:
            yield held
        finally:
            if held:
                await self._release(key, token)

    async def _acquire(self, key: str, token: str, ttl_s: float) -> bool:
        if self._redis is None:
            now = time.monotonic()
            current = self._local.get(key)
            if current is not None and current[1] > now:
                return False
            self._local[key] = (token, now + ttl_s)
            return True
        try:
            return bool(await self._redis.set(key, token, nx=True, px=int(ttl_s * 1000)))
        except (RedisError, OSError) as exc:
            raise Unavailable("the lock service is unavailable") from exc

    async def _release(self, key: str, token: str) -> None:
        if self._release_script is None:
            if self._local.get(key, ("", 0.0))[0] == token:
                del self._local[key]
            return
        with contextlib.suppress(RedisError, OSError):  # it expires by itself anyway
            await self._release_script(keys=[key], args=[token])  # EVALSHA, loaded once
