"""Provenance as pure functions: which argument strings came from untrusted results.

A run remembers every string toolgate returned to it in a result (keys and values, and the
text of numbers) as the set of its **windows**: the 8-character slices of its normalized
form, each as a 64-bit number. A string argument is **tainted** when its normalized form
has at least 8 characters, does not occur in the run's normalized task, and every one of
its characters lies in some window the run remembers. That holds when the argument occurs
inside one remembered value, and also when it was pieced together from parts of at least 8
characters each, taken from one or several values (a split value).

Normalization (both sides, so case, padding, separators and accents do not hide a value):
NFKC, case folding, then NFKD, which takes accents off their letters as combining marks;
then only **letters and digits** are kept, and every other character separates nothing: it
is dropped, whatever its kind (whitespace, punctuation, symbols such as ``|``, ``+``, ``→``
or ``│``, marks, control and format characters, private-use and unassigned code points).
``DE89 3704-0044.0532 0130 00``, ``DE89|3704|0044|0532|0130|00`` and
``de89370400440532013000`` are one value, and so are ``Zoë`` and ``zoe``: a value that
differs from a remembered one only by its accents or separators counts as copied.

What "letters and digits" means here, chosen as an attacker would probe it:

* a letter is a character of a Unicode ``L`` category, except modifier letters (``Lm``):
  many of them look like punctuation (U+02C8 a vertical line, U+02D0 a colon, U+02BC an
  apostrophe) and would otherwise split a value unseen; dropping them only makes more
  values look alike, never fewer;
* a digit is any ``N`` character (the numbers of every script); a decimal digit of any
  script (``Nd``: Arabic-Indic or Devanagari three) counts as the ASCII digit of the same
  value, since many parsers (Python's ``int`` among them) read it so, and a provider would
  act on the number it reads;
* combining marks are not letters: after NFKD they are the accents taken off, and the same
  marks stacked on a copied value hide nothing;
* characters that render as nothing (``_INVISIBLE``) are dropped even when Unicode files
  them as letters (a Hangul filler).

What this cannot see: a value the model transformed (translated, re-encoded, reordered,
spelled out, written with look-alike letters of another script), parts shorter than 8
characters, and an argument that wraps a remembered value in text of its own (only whole
arguments are judged).
"""

from __future__ import annotations

import hashlib
import itertools
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from app import evidence
from app.runs.comparison import DEFAULT_IGNORABLE

WINDOW = 8
"""Characters per window; also the shortest argument that is judged."""
MAX_WINDOWS = 500_000
"""Windows one run may remember (about 20,000 values of 30 characters). A result that does
not fit is not remembered, and from then on every judged argument of the run is tainted."""


_INVISIBLE = frozenset(
    chr(code)
    for first, last in (*DEFAULT_IGNORABLE, (0x2800, 0x2800))
    for code in range(first, last + 1)
)
"""Unicode's default-ignorable code points, which render as nothing, and the braille
blank, which renders as a space. Some are letters or symbols (a Hangul filler, the braille
blank), so the categories alone would keep them."""


class _Folding(dict[int, int | None]):
    """What each code point becomes once composed forms are taken apart: a ``str.translate``
    table (``None`` drops it), filled as characters are first met. ASCII is filled at import;
    beyond 65,536 entries nothing more is kept, so text made of every code point cannot grow
    it without end (such a character is worked out again each time)."""

    def __missing__(self, code: int) -> int | None:
        char = chr(code)
        category = unicodedata.category(char)
        kept: int | None = None
        if category == "Nd":
            kept = ord("0") + unicodedata.decimal(char)
        elif category[0] in "LN" and category != "Lm" and char not in _INVISIBLE:
            kept = code
        if len(self) < 65_536:
            self[code] = kept
        return kept


_FOLDING = _Folding()
for _code in range(128):
    _FOLDING.__missing__(_code)

_ASCII_LOWER = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")
_ASCII_SEPARATORS = bytes(c for c in range(128) if not chr(c).isalnum())
"""The same rules for text that is all ASCII, which needs no Unicode normalization: there
NFKC and NFKD change nothing and case folding is ``lower``, so the common case is one pass
of ``bytes.translate`` (half the time of ``str.translate``'s, whose table is a dict)."""


def normalized(text: str) -> str:
    """``text`` as provenance compares it (see the module's docstring): letters and digits
    only, case folded, without accents.

    Runs store the windows of this form when a result is returned, and they are never
    recomputed: a run lasts at most an hour and its memory goes with it. So a change of
    these rules needs no migration, but a run that spans the change is judged against
    windows of the older form; a string of letters and ASCII digits (spacing and punctuation
    aside) has the same windows under both, others may not (``docs/api.md``)."""
    if text.isascii():
        return text.encode().translate(_ASCII_LOWER, _ASCII_SEPARATORS).decode()
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return folded.translate(_FOLDING)


class _Splitting(dict[int, int | None]):
    """``_FOLDING`` for words: a character that is dropped within a value (a combining mark,
    one that renders as nothing) is dropped within a word too, and every other character
    that is not kept ends a word (it becomes a space)."""

    def __missing__(self, code: int) -> int | None:
        kept = _FOLDING[code]
        if kept is None:
            char = chr(code)
            joins = unicodedata.category(char)[0] == "M" or char in _INVISIBLE
            kept = None if joins else ord(" ")
        if len(self) < 65_536:
            self[code] = kept
        return kept


_SPLITTING = _Splitting()
_ASCII_WORDS = str.maketrans({c: " " for c in map(chr, range(128)) if not c.isalnum()})


def words(text: str) -> list[str]:
    """The words of ``text``, each normalized as ``normalized`` normalizes a value: what the
    separators between them (anything neither a letter nor a digit) delimit. ``"".join`` of
    a value's words is its ``normalized`` form."""
    if text.isascii():
        return text.lower().translate(_ASCII_WORDS).split()
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return folded.translate(_SPLITTING).split()


def windows(text: str) -> list[int]:
    """The windows of an already normalized ``text``, in order (one per start position).
    An ASCII window is its 8 bytes read as a number (exact); any other is the first 8 bytes
    of its BLAKE2b digest (a collision can only make a value look tainted, never hide it).
    Each window is judged on its own characters, so an ASCII value inside a longer text
    with other characters has the same windows as the value alone."""
    if text.isascii():
        data = text.encode()
        return [
            int.from_bytes(data[i : i + WINDOW], "big", signed=True)
            for i in range(len(data) - WINDOW + 1)
        ]
    return [_window(text[i : i + WINDOW]) for i in range(len(text) - WINDOW + 1)]


def _window(window: str) -> int:
    if window.isascii():
        return int.from_bytes(window.encode(), "big", signed=True)
    digest = hashlib.blake2b(window.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value: object keys and string leaves, at any depth, and the
    text of its numbers (an account number sent as a JSON number is read by the model, and
    copied into a string argument, just like one sent as a string)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield repr(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def remembered(result: Any, budget: int, arguments: Any = None) -> set[int] | None:
    """The distinct windows of every string in ``result``, except those that only echo a
    string of the call's own ``arguments`` (a transfer's answer repeating its recipient is
    no news from outside: if that value came from a result, the run remembers it from
    there); ``None`` when there could be more than ``budget`` windows (counted before
    hashing, so an oversized result costs little)."""
    texts = {text for text in map(normalized, strings(result)) if len(text) >= WINDOW}
    texts.difference_update(map(normalized, strings(arguments)))
    if sum(max(len(text) - WINDOW + 1, 0) for text in texts) > budget:
        return None
    found: set[int] = set()
    for text in texts:
        found.update(windows(text))
    return found


@dataclass(frozen=True)
class Candidate:
    """A string argument long enough to be judged: where it is, and its normalized form."""

    argument: str
    """Its name; a nested one is a dotted path (``payee.iban``, ``lines.0.note``)."""
    text: str
    windows: tuple[int, ...]


def candidates(
    arguments: Mapping[str, Any],
    exempt: Iterable[str] = (),
    opaque: Iterable[str] = (),
    declared: Iterable[str] = (),
) -> list[Candidate]:
    """The string arguments and object keys (at any depth, the arguments' names too) of at
    least ``WINDOW`` normalized characters,
    except the top-level arguments ``exempt`` (``x-identity``: always the session's own).
    Strings inside an ``opaque`` argument (``x-sensitive``) are named by that argument alone,
    so no key of its value is ever shown. A key among ``declared`` (the property names the
    tool's schema declares) is the catalog's word, not data: results name the same fields,
    so judging it would taint every call that nests one."""
    skip, hidden, known = set(exempt), set(opaque), frozenset(declared)
    found: list[Candidate] = []
    for name, value in arguments.items():
        if name in skip:
            continue
        # a tool free-form at the top takes any name: {"<iban>": amount}
        named = () if name in known else _candidates(name, name, known)
        for candidate in itertools.chain(named, _candidates(name, value, known)):
            if name in hidden and candidate.argument != name:
                candidate = Candidate(name, candidate.text, candidate.windows)
            found.append(candidate)
    return found


def _candidates(path: str, value: Any, declared: frozenset[str]) -> Iterator[Candidate]:
    if isinstance(value, str):
        text = normalized(value)
        if len(text) >= WINDOW:
            yield Candidate(path, text, tuple(windows(text)))
    elif isinstance(value, dict):
        for key, item in value.items():  # a key carries a value too: {"<iban>": amount}
            if key not in declared:
                yield from _candidates(f"{path}.{key}", key, declared)
            yield from _candidates(f"{path}.{key}", item, declared)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _candidates(f"{path}.{index}", item, declared)


def declared_names(schema: Any) -> frozenset[str]:
    """Every property name a JSON Schema declares (``properties``, at any depth, ``$defs``
    included): the keys ``candidates`` does not judge."""
    names: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            properties = node.get("properties")
            if isinstance(properties, Mapping):
                names.update(k for k in properties if isinstance(k, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return frozenset(names)


@dataclass(frozen=True)
class Recall:
    """What a run remembers that bears on one call: its task, and which of the call's
    windows it holds with the call that first returned each."""

    task: str | None
    found: Mapping[int, str]
    """Window → the id of the call whose result held it first."""
    forgotten_after: str | None = None
    """The call whose result the run could no longer remember (its bound was reached):
    from then on every judged argument not in the task counts as tainted, from that call."""


@dataclass(frozen=True)
class Taint:
    argument: str
    source_call_id: str

    def as_dict(self) -> evidence.Taint:
        return {"argument": self.argument, "source_call_id": self.source_call_id}


def findings(candidates: Iterable[Candidate], recall: Recall) -> tuple[Taint, ...]:
    """One ``Taint`` per (argument, source call) for every tainted argument, sources in the
    order they first cover the argument."""
    task = normalized(recall.task or "")
    found: dict[Taint, None] = {}
    for candidate in candidates:
        if candidate.text in task:
            continue
        sources = _covering_sources(candidate, recall.found)
        if sources is None and recall.forgotten_after is not None:
            sources = [recall.forgotten_after]
        found.update((Taint(candidate.argument, source), None) for source in sources or ())
    return tuple(found)


def _covering_sources(candidate: Candidate, found: Mapping[int, str]) -> list[str] | None:
    """The sources of the windows that cover every character of the candidate, or ``None``
    when some character lies in no remembered window."""
    covered_to = 0
    sources: dict[str, None] = {}
    for start, window in enumerate(candidate.windows):
        source = found.get(window)
        if source is None:
            continue
        if start > covered_to:
            return None
        covered_to = start + WINDOW
        sources[source] = None
    return list(sources) if covered_to >= len(candidate.text) else None
