"""The blocking client: ``httpx.Client`` carries the plans of ``_core``."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Self

import httpx

from toolgate_client._core import Operations, Pause, Plan, SyncRunner, T, Walk


class Client(Operations, SyncRunner):
    """toolgate's API, each operation answering at once (see ``Operations.__init__``)."""

    _http_class = httpx.Client
    _http: httpx.Client

    def _run(self, plan: Plan[T]) -> T:
        walk = Walk(plan)
        for step in walk:
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                continue
            try:
                walk.answer(self._http.send(step.build(self._http)))
            except httpx.TransportError as failure:
                walk.fail(failure)
        return walk.result

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        self.close()
