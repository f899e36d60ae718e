"""The docs cannot claim a flag a command lacks: every flag the README, ``docs/``,
``bench/`` and the scripts' own docstrings give a ``toolgate`` command or a ``bench/``
script, that command's ``--help`` lists."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.conftest import ROOT

DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "clients" / "python" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "bench" / "README.md",
    *sorted((ROOT / "bench").glob("*.py")),
]
# A command as the docs write it, and the rest of its line up to where another could begin.
COMMAND = re.compile(
    r"(?P<command>\btoolgate(?: (?!toolgate\b)[a-z][a-z-]*){1,2}|\bbench/[a-z_]+\.py)"
    r"(?P<rest>[^`|;&\n#]*)"
)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def documented() -> dict[tuple[str, ...], dict[str, set[str]]]:
    """``{command words: {flag: {where it is documented}}}``."""
    found: dict[tuple[str, ...], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in DOCUMENTS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in COMMAND.finditer(line):
                for flag in FLAG.findall(match["rest"]):
                    where = f"{path.relative_to(ROOT)}:{number}"
                    found[tuple(match["command"].split())][flag].add(where)
    return found


DOCUMENTED = documented()


def test_the_docs_document_commands_with_flags() -> None:
    """The scan itself finds what it must (else every check below passes vacuously)."""
    assert "--workers" in DOCUMENTED[("toolgate", "serve")], DOCUMENTED.keys()
    assert "--duration" in DOCUMENTED[("bench/run.py",)]


@pytest.mark.parametrize("command", sorted(DOCUMENTED), ids=" ".join)
def test_every_documented_flag_is_one_the_command_takes(command: tuple[str, ...]) -> None:
    if command[0] == "toolgate":
        argv = [sys.executable, "-m", "app.cli", *command[1:], "--help"]
    else:
        argv = [sys.executable, str(ROOT / command[0]), "--help"]
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr[-2000:]
    taken = set(FLAG.findall(shown.stdout))
    missing = {flag: sorted(where) for flag, where in DOCUMENTED[command].items()}
    missing = {flag: where for flag, where in missing.items() if flag not in taken}
    assert missing == {}, f"documented, but `{' '.join(command)} --help` lacks them"
