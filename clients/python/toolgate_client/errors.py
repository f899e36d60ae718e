"""The one exception the client raises for an answer it cannot turn into a result."""

from __future__ import annotations

from typing import Any


class ToolgateError(Exception):
    """A refusal or failure, carrying toolgate's problem document.

    ``code`` is the stable part to branch on (``tool_forbidden``, ``approval_required``,
    ``provider_timeout``, …). Two codes are the client's own: ``unreachable`` (no answer at
    all, ``status`` 0) and ``unexpected_response`` (an answer that is not a problem document,
    such as a proxy's error page, or an ``execute`` success that is not a JSON object).
    ``idempotency_key`` is set on errors from ``execute``: send it again to retry the same
    action, never a new one.
    """

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.code = str(problem.get("code") or "unexpected_response")
        self.detail = str(problem.get("detail") or problem.get("title") or "")
        self.call_id: str | None = problem.get("call_id")
        self.idempotency_key: str | None = None
        super().__init__(f"{status} {self.code}: {self.detail}")
