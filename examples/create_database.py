"""Create the PostgreSQL database named in a URL if it does not exist (demo setup only)."""

from __future__ import annotations

import asyncio
import sys

import asyncpg


async def create(url: str) -> None:
    base, name = url.rsplit("/", 1)
    name = name.split("?", 1)[0]
    conn = await asyncpg.connect(base + "/postgres")
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(create(sys.argv[1]))
