"""Which values of a result endorse later calls (catalog ``result.trusted``), as pure functions.

A trusted result vouches only for what nobody but the user or their tenant can write: a
message's sender or a channel's members, never a message's text, which its outsider wrote.
So ``result.trusted`` is ``true`` (the whole result) or the paths of such fields; the loader
compiles them once (``parsed``, ``refusal``) and a run reads each result's values there
(``trusted_values``).

A path is keys joined by dots, and ``[]`` after a key is every item of the list there:
``sender``, ``messages[].sender``, ``rows[][]``. A result that is itself a list starts with
``[]``: ``[].email``. A path leads only through the shape it spells (a key into an object,
``[]`` into a list) and finds nothing elsewhere; every string and number at or under the
value it leads to is trusted, each on its own. ``true`` is the path of no steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

EVERY: Final = None
"""A step that is every item of a list (written ``[]``)."""
FieldPath = tuple[str | None, ...]
"""Steps from the top of a result: a key, or ``EVERY``."""
WHOLE: tuple[FieldPath, ...] = ((),)
"""``trusted: true``: the path of no steps, the whole result."""

_PATH = re.compile(r"(?:[^.\[\]]+|\[\])(?:\[\])*(?:\.[^.\[\]]+(?:\[\])*)*")


def parsed(written: str) -> FieldPath | None:
    """``written`` as steps (``messages[].sender`` → ``("messages", EVERY, "sender")``), or
    ``None`` when it is no path: an empty key, a bracket that is not ``[]`` after a key,
    ``[]`` after a dot."""
    if not _PATH.fullmatch(written):
        return None
    steps: list[str | None] = []
    for segment in written.split("."):
        key, *lists = segment.split("[]")
        if key:
            steps.append(key)
        steps.extend(EVERY for _ in lists)
    return tuple(steps)


def refusal(path: FieldPath, fields: Sequence[str] | None, redact: Iterable[str]) -> str | None:
    """Why a result can never hold a value at ``path``, or ``None``: trimming keeps only
    ``fields`` (dotted paths, walked through lists, so ``messages[].sender`` lies within
    ``messages`` or ``messages.sender``), and a ``redact``ed field holds only its mask."""
    keys = [step for step in path if step is not None]
    if fields is not None and not any(_within(keys, kept) for kept in fields):
        return "is not within a kept field (result.fields): the result never has it"
    for masked in redact:
        if _within(keys, masked):
            return f"is within the redacted field {masked!r}: it never holds a value"
    return None


def _within(keys: list[str], dotted: str) -> bool:
    field = dotted.split(".")
    return keys[: len(field)] == field


def trusted_values(result: Any, trusted: tuple[FieldPath, ...]) -> list[str]:
    """Every string, and the text of every number (``repr``, as provenance reads numbers),
    at or under the ``trusted`` paths of ``result``, each on its own, in the result's
    order; object keys, booleans and nulls are no values. ``WHOLE`` takes every value of
    the result; ``()`` (an untrusted tool) none."""
    found: list[str] = []
    if trusted:
        _gather(result, trusted, found)
    return found


def _gather(node: Any, paths: tuple[FieldPath, ...], found: list[str]) -> None:
    """Walk ``node`` once, whatever the number of paths, so values come in its order."""
    if () in paths:
        found.extend(_values(node))
    elif isinstance(node, dict):
        for key, value in node.items():
            rests = tuple(path[1:] for path in paths if path[0] == key)
            if rests:
                _gather(value, rests, found)
    elif isinstance(node, list):
        rests = tuple(path[1:] for path in paths if path[0] is EVERY)
        if rests:
            for item in node:
                _gather(item, rests, found)


def _values(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield repr(node)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _values(value)
    elif isinstance(node, list):
        for item in node:
            yield from _values(item)
