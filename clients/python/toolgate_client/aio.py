"""The asyncio client: ``httpx.AsyncClient`` carries the plans of ``_core``."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

import httpx

from toolgate_client._core import AsyncRunner, Operations, Pause, Plan, T, Walk


class AsyncClient(Operations, AsyncRunner):
    """toolgate's API, each operation awaited (see ``Operations.__init__``)."""

    _http_class = httpx.AsyncClient
    _http: httpx.AsyncClient

    async def _run(self, plan: Plan[T]) -> T:
        walk = Walk(plan)
        for step in walk:
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                continue
            try:
                walk.answer(await self._http.send(step.build(self._http)))
            except httpx.TransportError as failure:
                walk.fail(failure)
        return walk.result

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        await self.aclose()
