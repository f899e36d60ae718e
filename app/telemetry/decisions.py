"""The three one-line hooks services report through: ``bind_call`` (the call a request is
deciding), ``decided`` (an allow or a denial, where it is stored) and ``executed`` (an
outcome). They count (``app.metrics``) and write the decision log; nothing here sees
argument values."""

from __future__ import annotations

import logging

from app import metrics
from app.telemetry.context import CallAttempt, request_fields

_log = logging.getLogger("toolgate.calls")


def bind_call(attempt: CallAttempt, call_id: str) -> None:
    """Remember the call this request is deciding, for log lines and provider spans."""
    fields = request_fields.get()
    if fields is not None:
        fields.attempt, fields.call_id, fields.run_id = attempt, call_id, attempt.run_id


def decided(
    attempt: CallAttempt, call_id: str, code: str | None = None, *, quiet: bool = False
) -> None:
    """Count and log one stored decision: an allow, or a denial with its problem ``code``.
    ``quiet``: count only, as the ``executed`` line that follows says it was allowed."""
    tool = attempt.tool.name if attempt.tool is not None else metrics.UNKNOWN_TOOL
    outcome = "allow" if code is None else "deny"
    metrics.decisions(tool, outcome, code or "").inc()
    fields = request_fields.get()
    if fields is not None:
        fields.call_id = call_id
    if quiet:
        return
    _log.info(
        "%s %s%s",
        outcome,
        tool,
        f": {code}" if code else "",
        extra={"fields": {"call_id": call_id, "tool": tool, "outcome": outcome, "code": code}},
    )


def executed(tool: str, call_id: str, status: str) -> None:
    """Count and log one execution outcome: succeeded, failed, unknown or replayed."""
    metrics.executions(tool, status).inc()
    _log.log(
        logging.WARNING if status == "unknown" else logging.INFO,
        "executed %s: %s",
        tool,
        status,
        extra={"fields": {"call_id": call_id, "tool": tool, "status": status}},
    )
