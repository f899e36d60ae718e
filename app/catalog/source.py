"""Reading catalog YAML with the line of every node, so each problem names its place.

A catalog is one file or a directory of ``*.yaml`` files merged by section; a name defined
twice is a problem, not a silent override.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.canonical import SAFE_INTEGER

Path_ = tuple[str | int, ...]
SECTIONS = ("providers", "resources", "tools")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    path: Path_
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        dotted = ".".join(str(p) for p in self.path)
        return f"{where}: {dotted}: {self.message}" if dotted else f"{where}: {self.message}"


@dataclass
class Source:
    """The merged raw document plus where each node came from."""

    document: dict[str, Any] = field(default_factory=dict)
    lines: dict[Path_, tuple[str, int]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    """What ``toolgate check`` points out without refusing the catalog."""

    def problem(self, path: Path_, message: str) -> None:
        """Record a problem at the deepest known location along ``path``."""
        self.problems.append(self._at(path, message))

    def warning(self, path: Path_, message: str) -> None:
        """Record a warning, placed as a problem is."""
        self.warnings.append(self._at(path, message))

    def _at(self, path: Path_, message: str) -> Problem:
        for depth in range(len(path), -1, -1):
            where = self.lines.get(path[:depth])
            if where:
                return Problem(where[0], where[1], path, message)
        return Problem(self.files[0] if self.files else "-", None, path, message)


def read(location: Path) -> Source:
    source = Source()
    files: list[Path] = []
    try:  # is_dir and is_file raise for a name too long, or a directory we may not search
        if location.is_dir():
            files = sorted(location.glob("*.yaml"))
            if not files:
                source.problems.append(Problem(str(location), None, (), "no *.yaml files"))
        elif location.is_file():
            files = [location]
        else:
            source.problems.append(Problem(str(location), None, (), "no such file or directory"))
    except OSError as exc:
        source.problems.append(Problem(str(location), None, (), f"unreadable: {exc.strerror}"))
    for file in files:
        _merge(source, file)
    return source


def _text(file: Path) -> str:
    """The file's text, if it is a regular file: opened without waiting, since a FIFO (or a
    link to a device) named ``*.yaml`` would block a load, and with it a reload or
    ``catalog check``, for as long as nothing writes to it (or read without end)."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as opened:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return opened.read().decode("utf-8")


def _merge(source: Source, file: Path) -> None:
    name = str(file)
    source.files.append(name)
    builder = _Builder(name)
    try:  # composing and building both recurse per level of nesting
        node = yaml.compose(_text(file), Loader=yaml.SafeLoader)
        if node is None:
            return
        data = builder.value(node, ())
    except OSError as exc:
        source.problems.append(Problem(name, None, (), f"unreadable: {exc.strerror}"))
        return
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        source.problems.append(
            Problem(name, line + 1 if line is not None else None, (), f"unreadable: {exc}")
        )
        return
    except RecursionError:
        source.problems.append(Problem(name, 1, (), "nested too deeply"))
        return
    except _TooLarge as bound:
        message = f"expands to more than {MAX_VALUES:,} values (aliases count each time used)"
        source.problems.append(Problem(name, bound.line, bound.path, message))
        return
    source.problems.extend(builder.problems)
    lines = builder.lines
    if not isinstance(data, dict):
        source.problems.append(Problem(name, node.start_mark.line + 1, (), "must be a mapping"))
        return
    for key, value in data.items():
        if key in SECTIONS:
            # An empty section (``tools:``) adds nothing; it must not replace another file's.
            if not isinstance(value, dict | None):
                where = lines.get((key,), (name, None))
                message = "must be a mapping of names to entries"
                source.problems.append(Problem(where[0], where[1], (key,), message))
                continue
            section = source.document.setdefault(key, {})
            for entry, spec in (value or {}).items():
                if entry in section:
                    where = lines.get((key, entry), (name, None))
                    source.problems.append(
                        Problem(where[0], where[1], (key, entry), "defined more than once")
                    )
                section[entry] = spec
        elif key == "notify" and key in source.document:
            where = lines.get((key,), (name, None))
            source.problems.append(Problem(where[0], where[1], (key,), "defined more than once"))
        elif key == "version" and "version" in source.document:
            if source.document["version"] != value:
                where = lines.get(("version",), (name, None))
                source.problems.append(
                    Problem(where[0], where[1], ("version",), "files disagree on version")
                )
        else:
            source.document[key] = value
    for path, where in lines.items():
        source.lines.setdefault(path, where)


MAX_VALUES = 100_000
"""Values one file may expand to, an alias counted each time it is used: a few hundred bytes
of aliases nested ten deep (a "billion laughs") would otherwise expand past any memory."""


class _TooLarge(Exception):
    """Raised at the value past ``MAX_VALUES``: its path and line."""

    def __init__(self, path: Path_, line: int) -> None:
        super().__init__(path, line)
        self.path, self.line = path, line


class _Builder:
    """One file's document from its YAML nodes: JSON values only, each node's line noted, a
    key repeated in one mapping or an alias inside itself a problem, never a silent choice."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: dict[Path_, tuple[str, int]] = {}
        self.problems: list[Problem] = []
        self._values = 0
        self._open: set[int] = set()
        """The collections being built around the current node (ids), to find cycles."""

    def value(self, node: yaml.Node, path: Path_) -> Any:
        self._values += 1
        line = node.start_mark.line + 1
        if self._values > MAX_VALUES:
            raise _TooLarge(path, line)
        self.lines[path] = (self.file, line)
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path, line)
        if id(node) in self._open:
            self.problems.append(Problem(self.file, line, path, "an alias inside itself"))
            return None
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.value(item, (*path, i)) for i, item in enumerate(node.value)]
            result: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = _scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
                if not isinstance(key, str):
                    # YAML reads ``on`` as true, ``~`` as null, ``0x10`` as 16: as text they
                    # would name something nobody wrote ("True", "None", "16").
                    where = key_node.start_mark.line + 1
                    message = "a key must be text: quote it"
                    self.problems.append(Problem(self.file, where, path, message))
                    continue
                if key in result:
                    where = key_node.start_mark.line + 1
                    self.problems.append(
                        Problem(self.file, where, (*path, key), "defined more than once")
                    )
                    continue
                result[key] = self.value(value_node, (*path, key))
            return result
        finally:
            self._open.discard(id(node))

    def _scalar(self, node: yaml.Node, path: Path_, line: int) -> Any:
        value = _scalar(node)
        kind = type(value)
        if kind is float and not math.isfinite(value):
            self.problems.append(Problem(self.file, line, path, "not a finite number"))
        elif kind is int and not -SAFE_INTEGER <= value <= SAFE_INTEGER:
            self.problems.append(
                Problem(self.file, line, path, "an integer beyond ±(2**53 - 1): JSON cannot say it")
            )
        elif kind not in (str, int, float, bool, type(None)):
            self.problems.append(
                Problem(self.file, line, path, f"not a JSON value (YAML made a {kind.__name__})")
            )
        else:
            return value
        return None


def _scalar(node: yaml.Node) -> Any:
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Replace ``${NAME}`` / ``${NAME:-default}``; an unset name without default is an error."""

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise KeyError(name)

    return _ENV_REF.sub(substitute, value)
