"""Progress of long command-line work on a terminal: rows done, rate and time left.

Only when standard error is a terminal (and not a dumb one): piped or logged output, exit
statuses and what a command prints on standard output never change. One line, rewritten
at most every ``EVERY_S``, cleared when the work is done.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

EVERY_S = 0.2

Report = Callable[[str, int, int | None], None]
"""``report(what, done, total)``: ``done`` of ``total`` (``None``: not known) of ``what``."""


def quiet(what: str, done: int, total: int | None) -> None:
    """The report of work nobody watches (the API, tests)."""


class Progress:
    """A ``Report`` that draws on ``stream`` (standard error), if it is a terminal."""

    def __init__(
        self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._clock = clock
        self.shown = _terminal(self._stream)
        self._what: str | None = None
        self._started = self._drawn = 0.0

    def __call__(self, what: str, done: int, total: int | None) -> None:
        if not self.shown:
            return
        now = self._clock()
        if what != self._what:
            self._what, self._started, self._drawn = what, now, -EVERY_S
        finished = total is not None and done >= total
        if now - self._drawn < EVERY_S and not finished:
            return
        self._drawn = now
        self._draw("\r" + line(what, done, total, now - self._started) + "\x1b[K")

    def close(self) -> None:
        """Clear the line, so what the command prints next starts on a clean one."""
        if self.shown and self._what is not None:
            self._draw("\r\x1b[K")

    def _draw(self, text: str) -> None:
        """Progress is a courtesy: a terminal that went away turns it off, never fails the
        command."""
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            self.shown = False


def line(what: str, done: int, total: int | None, elapsed: float) -> str:
    """``verifying the chain: 1,200,000 of 3,000,000 rows (40%), 18,500/s, 1 min 37 s left``"""
    rate = done / elapsed if elapsed > 0 else 0.0
    text = f"{what}: {done:,}"
    if total:
        text += f" of {total:,} ({min(done, total) * 100 // total}%)"
    if rate:
        text += f", {rate:,.0f}/s"
        if total and done < total:
            text += f", {_duration((total - done) / rate)} left"
    return text


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except ValueError:  # closed
        return False
