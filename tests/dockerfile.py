"""The repository's Dockerfile as instructions, for tests that check it without Docker."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT


def instructions(path: Path = ROOT / "Dockerfile") -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments left out."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip().removesuffix("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, arguments = pending.strip().partition(" ")
            found.append((keyword.upper(), arguments.strip()))
            pending = ""
    return found


def copied_sources() -> list[str]:
    """What the COPY instructions take from the build context."""
    sources: list[str] = []
    for keyword, arguments in instructions():
        words = arguments.split()
        if keyword == "COPY" and not any(w.startswith("--from") for w in words):
            sources += words[:-1]
    return sources


def healthcheck_command() -> list[str]:
    """The exec-form command of HEALTHCHECK, without its options."""
    (arguments,) = [a for k, a in instructions() if k == "HEALTHCHECK"]
    return list(json.loads(arguments[arguments.index("CMD ") + 4 :]))
