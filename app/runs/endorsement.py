"""Endorsement: did an argument's value come from someone the user trusts? Pure; no I/O.

Taint (``provenance``) asks whether a value was copied from an untrusted result, which a
model escapes by joining, re-spelling or re-encoding the value. Endorsement asks the
opposite question, which no transformation escapes: an ``x-endorsed`` argument's value is
endorsed only when it

1. occurs in the run's ``task`` (the human's own words),
2. occurs in a result returned earlier in the run by a tool whose results are ``trusted``
   (data only the user or their tenant can write), or
3. is a **known value** of the tenant for the argument's kind (added by an approver or an
   admin, never by a model).

Values are compared in the form provenance compares them (``provenance.normalized``: case,
accents, spacing and punctuation do not count). "Occurs in" must not endorse by accident, so
a value must match whole words of the text (``Eve`` is not endorsed by "every", nor
``general`` by "generally"); a value of ``provenance.WINDOW`` characters or more may also
match inside longer words (an IBAN written without its spaces). A known value must be the
value exactly (in that form). A value several sources hold is named by the first that
holds it, cheapest first: the task, the known values, the trusted results.

``x-endorsed: links`` judges free text: every URL, e-mail address and host name found in it
must be endorsed on its own (host names are those under a public suffix, so ``report.txt``
is a file, not a host); the rest of the text is not judged.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Literal, NamedTuple

from publicsuffixlist import PublicSuffixList

from app import evidence
from app.catalog.models import Endorsed
from app.runs.provenance import WINDOW, normalized, words

Source = Literal["task", "trusted_result", "known"]
MAX_TRUSTED_CHARS = 262_144
"""How much of its trusted results a run keeps to endorse values by (their words). Past it,
later trusted results endorse nothing: a value they alone hold needs an approval."""
SOURCES: tuple[Source, ...] = ("task", "trusted_result", "known")


class Text:
    """A text's words, to find values in. Kept as they are stored (separated by single
    spaces, ``spaced``), so that taking in a run's trusted results (a quarter of a megabyte)
    costs nothing per call: a value is looked for in the joined words only when it is long
    enough to match anywhere, and otherwise as whole words of the spaced form."""

    __slots__ = ("_joined", "_padded")

    def __init__(self, spaced: str) -> None:
        self._padded = f" {spaced} "
        self._joined: str | None = None

    @classmethod
    def of(cls, found: Iterable[str]) -> Text:
        return cls(" ".join(found))

    @classmethod
    def stored(cls, spaced: str) -> Text:
        """A text stored as its words separated by single spaces (``spaced``)."""
        return cls(spaced)

    def holds(self, value: str) -> bool:
        """Whether the normalized ``value`` occurs here: as whole words, or, when it has
        ``WINDOW`` characters or more, anywhere."""
        if not value:
            return False
        if len(value) >= WINDOW:
            if self._joined is None:
                self._joined = self._padded.replace(" ", "")
            return value in self._joined
        return _whole_words(value).search(self._padded) is not None


@lru_cache(maxsize=1024)
def _whole_words(value: str) -> re.Pattern[str]:
    """``value`` as one or more whole words of a spaced text (padded with a space at each
    end): a word boundary may fall between any two of its characters."""
    return re.compile(" " + " ?".join(map(re.escape, value)) + " ")


class TrustedTexts:
    """The trusted results of the runs this process judged last (``runs`` of them, each
    at most ``MAX_TRUSTED_CHARS``), as ``Text``: what a run keeps of them only grows, by
    whole results, so the count of its characters names its texts, and the database sends
    them again only when that count has changed. Pure: it holds what it is given."""

    def __init__(self, runs: int = 32) -> None:
        self._runs = runs
        self._held: OrderedDict[str, tuple[int, tuple[Text, ...]]] = OrderedDict()

    def get(self, run_id: str) -> tuple[int, tuple[Text, ...]] | None:
        """The run's held texts and their count of characters, if held."""
        held = self._held.get(run_id)
        if held is not None:
            self._held.move_to_end(run_id)
        return held

    def put(self, run_id: str, chars: int, stored: Iterable[str]) -> tuple[Text, ...]:
        """Hold the run's texts (``chars`` characters, as stored), replacing what was held,
        and forget the least recently used run past ``runs``."""
        texts = tuple(map(Text.stored, stored))
        self._held[run_id] = (chars, texts)
        self._held.move_to_end(run_id)
        while len(self._held) > self._runs:
            self._held.popitem(last=False)
        return texts


def spaced(text: str) -> str:
    """How a text is stored to be judged against later (``Text.stored``)."""
    return " ".join(words(text))


class Sources(NamedTuple):
    """What can endorse a call's values, looked up for it."""

    task: Text | None
    """The run's task; ``None`` outside a run, or for a run without one."""
    trusted: tuple[Text, ...]
    """Trusted results returned earlier in the run."""
    known: frozenset[str]
    """The digests (``digest``) of the candidates that are known values of the tenant."""


class Endorsement(NamedTuple):
    """What endorses an ``x-endorsed`` argument, or why nothing does."""

    argument: str
    source: Source | None
    """What endorses it (for ``links``, what endorses its first link); ``None``: not
    endorsed, or nothing in its text needed endorsing (``endorsed`` tells)."""
    endorsed: bool
    reason: str | None = None
    """Why it is not endorsed, in words an approver reads; never a value."""

    def as_dict(self) -> evidence.EndorsementItem:
        found: evidence.EndorsementItem = {
            "argument": self.argument,
            "source": self.source,
            "endorsed": self.endorsed,
        }
        if self.reason is not None:
            found["reason"] = self.reason
        return found


def digest(kind: str, value: str) -> str:
    """A known value's key: its kind and normalized form, hashed, so a sensitive value (a
    password) is stored and looked up without being kept."""
    material = f"{kind}\0{normalized(value)}".encode()
    return "sha256:" + hashlib.sha256(material).hexdigest()


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s<>\"'`]+", re.IGNORECASE)
_EMAIL = re.compile(r"[a-z0-9!#$%&'*+/=?^_`{|}~.-]+@(?:[a-z0-9-]+\.)+[a-z0-9-]{2,}", re.IGNORECASE)
_HOST = re.compile(
    r"(?<![\w@.-])(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9-]{2,63}(?![\w-])",
    re.IGNORECASE,
)
_IPV4 = re.compile(r"(?<![\w.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?::[0-9]{1,5})?(?![\w.]?\w)")
"""An IPv4 address written out (a port may follow): a host as much as a name is."""
_TRAILING = ".,;:!?)]}>'\""
_SUFFIXES = PublicSuffixList(accept_unknown=False)


def links(text: str) -> list[str]:
    """The URLs, e-mail addresses and hosts in ``text``, in order: a URL whole (its
    trailing punctuation aside), an address whole, and an IPv4 address or a host name (under
    a public suffix) that is part of neither."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for pattern in (_URL, _EMAIL):
        for match in pattern.finditer(text):
            start = match.start()
            if any(s <= start < e for s, e in taken):
                continue
            item = match.group().rstrip(_TRAILING)
            taken.append((start, start + len(item)))
            found.append((start, item))
    for match in _IPV4.finditer(text):
        start = match.start()
        if any(s <= start < e for s, e in taken) or not _is_ipv4(match.group()):
            continue
        taken.append((start, match.end()))
        found.append((start, match.group()))
    for match in _HOST.finditer(text):
        start = match.start()
        if any(s <= start < e for s, e in taken):
            continue
        host = match.group().rstrip(".")
        if _SUFFIXES.publicsuffix(host.lower()) is not None and "." in host:
            found.append((start, host))
    return [item for _, item in sorted(found)]


def _is_ipv4(written: str) -> bool:
    try:
        ipaddress.IPv4Address(written.partition(":")[0])
    except ValueError:
        return False
    return True


def candidates(endorsed: Iterable[Endorsed], arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every ``(kind, value)`` a known value could endorse for the call: the whole value of
    a ``value`` argument, each link of a ``links`` argument. Absent or empty arguments have
    nothing to endorse."""
    found = []
    for arg in endorsed:
        for item in _items(arg, arguments.get(arg.argument)):
            found.append((arg.kind, item))
    return found


def _items(arg: Endorsed, value: Any) -> list[str]:
    if value is None or isinstance(value, bool):
        return []
    text = value if isinstance(value, str) else str(value)
    if arg.mode == "links":
        return links(text)
    return [text]


def judge(
    endorsed: Iterable[Endorsed], arguments: Mapping[str, Any], sources: Sources | None
) -> tuple[Endorsement, ...]:
    """Each present ``x-endorsed`` argument's endorsement. With no ``sources`` (none could
    be looked up) nothing is endorsed: fail closed."""
    found = []
    for arg in endorsed:
        if arg.argument not in arguments or arguments[arg.argument] is None:
            continue
        items = _items(arg, arguments[arg.argument])
        endorsing = [_source(arg.kind, item, sources) for item in items]
        if not items:
            found.append(Endorsement(arg.argument, None, True))
        elif None in endorsing:
            unendorsed = endorsing.count(None)
            found.append(Endorsement(arg.argument, None, False, _why(arg, unendorsed, len(items))))
        else:
            found.append(Endorsement(arg.argument, endorsing[0], True))
    return tuple(found)


def _source(kind: str, item: str, sources: Sources | None) -> Source | None:
    if sources is None:
        return None
    value = normalized(item)
    if sources.task is not None and sources.task.holds(value):
        return "task"
    if digest(kind, item) in sources.known:  # before the trusted texts: it costs nothing
        return "known"
    if any(text.holds(value) for text in sources.trusted):
        return "trusted_result"
    return None


def _why(arg: Endorsed, unendorsed: int, of: int) -> str:
    what = "its value is" if arg.mode == "value" else f"{unendorsed} of its {of} links are"
    return (
        f"{what} not in the run's task, not from a trusted result, and not a known"
        f" {arg.kind} of the tenant"
    )
