"""Structured logs: one JSON object per line, carrying the request's correlation ids.

Each line has ``time``, ``level``, ``logger`` and ``message``, plus ``call_id``, ``run_id``,
``trace_id`` and ``span_id`` when the request knows them, and the ``fields`` a caller passed
as ``extra={"fields": {...}}``. The ids are taken where a line is logged (the request's
context is at hand there); a background thread builds the JSON and writes it, so the event
loop never blocks on stderr. ``toolgate serve`` installs this through uvicorn's
``log_config``. Lines logged in the last ``WRITE_EVERY_S`` before a SIGTERM may be lost: uvicorn
re-raises the signal once it has stopped, so ``atexit`` does not run.
"""

from __future__ import annotations

import atexit
import logging
import math
import queue
import sys
import threading
from datetime import UTC, datetime
from typing import IO, Any

import orjson
from opentelemetry import trace

from app.telemetry import current_fields, current_span

QUEUE_SIZE = 10_000
WRITE_EVERY_S = 0.05


Ids = tuple[str | None, str | None, int, int]
"""``call_id``, ``run_id``, trace id and span id (0 when there is no span)."""


def stamp(record: logging.LogRecord) -> Ids:
    """The request's ids, attached to the record in the context where it was logged."""
    ids: Ids | None = getattr(record, "toolgate_ids", None)
    if ids is None:
        fields = current_fields()
        span = current_span().get_span_context()
        ids = (
            fields.call_id if fields is not None else None,
            fields.run_id if fields is not None else None,
            span.trace_id if span.is_valid else 0,
            span.span_id if span.is_valid else 0,
        )
        record.toolgate_ids = ids
    return ids


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")
        """The last second formatted, and its text up to the seconds."""

    def format(self, record: logging.LogRecord) -> str:
        call_id, run_id, trace_id, span_id = stamp(record)
        line: dict[str, Any] = {
            "time": self.time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if call_id is not None:
            line["call_id"] = call_id
        if run_id is not None:
            line["run_id"] = run_id
        if trace_id:
            line["trace_id"] = trace.format_trace_id(trace_id)
            line["span_id"] = trace.format_span_id(span_id)
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line.update((k, v) for k, v in extra.items() if v is not None)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()

    def time(self, created: float) -> str:
        """``created`` in UTC as ISO 8601 to the millisecond (``2026-12-01T02:31:21.873+00:00``),
        each second's date and time made once: a datetime built for every line cost about
        as much as the rest of the line's formatting."""
        fraction, whole = math.modf(created)  # rounded as datetime.fromtimestamp rounds
        second, micros = divmod(int(whole) * 1_000_000 + round(fraction * 1e6), 1_000_000)
        cached = self._second  # read once: another thread may store another second
        if cached[0] != second:
            cached = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
            self._second = cached
        return f"{cached[1]}.{micros // 1000:03d}+00:00"


class QueuedStream(logging.Handler):
    """Stamps a record's ids where it is logged; a background thread formats and writes.

    The writer wakes every ``WRITE_EVERY_S`` rather than on each line: waking a thread per
    line cost more CPU (GIL hand-offs) than the line itself, and formatting in batches is
    cheaper than one by one between requests. The queue holds at most
    ``QUEUE_SIZE`` lines; if the stream stalls that long, newer lines are dropped (and
    counted in ``dropped``) rather than blocking the event loop or growing without bound.
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        # No line shows where, in which thread or in which process it was logged: skip
        # finding out for every record (Logging HOWTO, "Optimization"). Set here, as this
        # handler is configured in each worker.
        logging._srcfile = None
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
        self.dropped = 0
        self._stream = stream if stream is not None else sys.stderr
        self._lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._writer: threading.Thread | None = threading.Thread(
            target=self._write, name="toolgate-log-writer", daemon=True
        )
        self._writer.start()
        atexit.register(self.close)

    def handle(self, record: logging.LogRecord) -> bool:
        """Without the handler lock: stamping needs none and the queue is thread-safe."""
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        """Stamp the ids and merge the message now; JSON is built by the writer, in batches."""
        if self._lines.qsize() >= QUEUE_SIZE:
            self.dropped += 1
            return
        try:
            stamp(record)
            record.msg, record.args = record.getMessage(), None
        except Exception:
            self.handleError(record)
            return
        self._lines.put(record)

    def _write(self) -> None:
        while not self._stop.wait(WRITE_EVERY_S):
            self._drain()
        self._drain()

    def _drain(self) -> None:
        lines = []
        while not self._lines.empty():
            record = self._lines.get_nowait()
            try:
                lines.append(self.format(record))
            except Exception:
                self.handleError(record)
        if lines:
            try:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                self.dropped += len(lines)

    def close(self) -> None:
        """Write out what is queued and stop the writer thread (idempotent)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            self._stop.set()
            writer.join(timeout=5)
        super().close()


CALLERS_TRACE_CONTEXT = (
    "opentelemetry.baggage.propagation",
    "opentelemetry.trace.propagation.tracecontext",
    "opentelemetry.trace.span",  # the tracestate parser's
)
"""The loggers that warn about a caller's malformed ``traceparent``, ``tracestate`` or
``baggage``: anyone can send those, before authentication, and one ``baggage`` header made
thousands of warnings. The headers are ignored either way; only errors are logged."""


def log_config(level: str = "INFO") -> dict[str, Any]:
    """``logging.config.dictConfig`` for uvicorn: JSON lines on stderr for every logger;
    toolgate's and uvicorn's at ``level``, libraries' only from WARNING up, and
    ``CALLERS_TRACE_CONTEXT`` only from ERROR up."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "app.logs.JsonFormatter"}},
        "handlers": {"json": {"()": "app.logs.QueuedStream", "formatter": "json"}},
        "root": {"handlers": ["json"], "level": "WARNING"},
        "loggers": {
            name: {"handlers": [], "level": level, "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "toolgate")
        }
        | {name: {"level": "ERROR"} for name in CALLERS_TRACE_CONTEXT},
    }
