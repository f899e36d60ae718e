"""The Redis facade. Redis only keeps instances from doing the same work at once; PostgreSQL
remains the source of truth, so a lost lock never causes a second side effect."""

from __future__ import annotations

import redis.asyncio as redis
from redis.exceptions import RedisError


class Locks:
    def __init__(self, url: str | None, prefix: str = "toolgate:") -> None:
        self._redis = redis.Redis.from_url(url) if url else None
        self.prefix = prefix

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
