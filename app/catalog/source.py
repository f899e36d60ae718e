"""Reading catalog YAML with the line of every node, so each problem names its place.

A catalog is one file or a directory of ``*.yaml`` files merged by section; a name defined
twice is a problem, not a silent override.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

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

    def problem(self, path: Path_, message: str) -> None:
        """Record a problem at the deepest known location along ``path``."""
        for depth in range(len(path), -1, -1):
            where = self.lines.get(path[:depth])
            if where:
                self.problems.append(Problem(where[0], where[1], path, message))
                return
        self.problems.append(Problem(self.files[0] if self.files else "-", None, path, message))


def read(location: Path) -> Source:
    source = Source()
    if location.is_dir():
        files = sorted(location.glob("*.yaml"))
        if not files:
            source.problems.append(Problem(str(location), None, (), "no *.yaml files"))
    elif location.is_file():
        files = [location]
    else:
        source.problems.append(Problem(str(location), None, (), "no such file or directory"))
        files = []
    for file in files:
        _merge(source, file)
    return source


def _merge(source: Source, file: Path) -> None:
    name = str(file)
    source.files.append(name)
    try:
        node = yaml.compose(file.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        source.problems.append(
            Problem(name, line + 1 if line is not None else None, (), f"unreadable: {exc}")
        )
        return
    if node is None:
        return
    lines: dict[Path_, tuple[str, int]] = {}
    data = _construct(node, (), name, lines)
    if not isinstance(data, dict):
        source.problems.append(Problem(name, node.start_mark.line + 1, (), "must be a mapping"))
        return
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            section = source.document.setdefault(key, {})
            for entry, spec in value.items():
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


def _construct(node: yaml.Node, path: Path_, file: str, lines: dict[Path_, tuple[str, int]]) -> Any:
    lines[path] = (file, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(_scalar(key_node))
            result[key] = _construct(value_node, (*path, key), file, lines)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*path, i), file, lines) for i, item in enumerate(node.value)]
    return _scalar(node)


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
