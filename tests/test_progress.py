"""Progress on a terminal for long command-line work: what the line says, and that nothing
is written when standard error is not a terminal."""

from __future__ import annotations

import io
from typing import Any

import pytest

from app.progress import EVERY_S, Progress, line


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_says_rows_done_of_the_total_the_rate_and_the_time_left() -> None:
    said = line("verifying the chain", 1_200_000, 3_000_000, 64.0)
    assert said == ("verifying the chain: 1,200,000 of 3,000,000 (40%), 18,750/s, 1 min 36 s left")
    assert line("sealing", 500, None, 2.0) == "sealing: 500, 250/s"
    assert line("sealing", 10, 10, 1.0) == "sealing: 10 of 10 (100%), 10/s"
    assert line("migrations", 0, 3, 0.0) == "migrations: 0 of 3 (0%)"
    assert "2 h 46 min left" in line("x", 1, 10_001, 1.0)


def test_a_terminal_gets_one_line_rewritten_at_most_every_interval_then_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TERM", raising=False)
    stream, clock = Terminal(), Clock()
    progress = Progress(stream, clock)
    progress("verifying the chain", 0, 1000)
    clock.now += EVERY_S / 2
    progress("verifying the chain", 10, 1000)  # too soon: not drawn
    clock.now += EVERY_S
    progress("verifying the chain", 500, 1000)
    clock.now += EVERY_S / 10
    progress("verifying the chain", 1000, 1000)  # the end is always drawn
    progress.close()
    drawn = stream.getvalue().split("\r")
    assert drawn[1:-1] == [
        "verifying the chain: 0 of 1,000 (0%)\x1b[K",
        "verifying the chain: 500 of 1,000 (50%), 1,667/s, 0 s left\x1b[K",
        "verifying the chain: 1,000 of 1,000 (100%), 3,125/s\x1b[K",
    ]
    assert drawn[-1] == "\x1b[K"  # cleared for what the command prints next


@pytest.mark.parametrize(
    ("stream", "term"), [(io.StringIO(), "xterm"), (Terminal(), "dumb")], ids=["pipe", "dumb"]
)
def test_nothing_is_written_where_nobody_watches(
    monkeypatch: pytest.MonkeyPatch, stream: Any, term: str
) -> None:
    monkeypatch.setenv("TERM", term)
    progress = Progress(stream, Clock())
    progress("sealing", 5, 10)
    progress.close()
    assert stream.getvalue() == ""


def test_a_terminal_that_went_away_turns_progress_off_and_fails_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TERM", raising=False)

    class Gone(Terminal):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    progress = Progress(Gone(), Clock())
    progress("sealing", 1, 10)
    assert progress.shown is False
    progress("sealing", 2, 10)
    progress.close()
