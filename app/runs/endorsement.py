"""Endorsement: did an argument's value come from someone the user trusts? Pure; no I/O.

Taint (``provenance``) asks whether a value was copied from an untrusted result, which a
model escapes by joining, re-spelling or re-encoding the value. Endorsement asks the
opposite question, which no transformation escapes: an ``x-endorsed`` argument's value is
endorsed only when it

1. occurs in the run's ``task`` (the human's own words),
2. occurs in one value of a result returned earlier in the run by a tool whose results (or
   the fields of them) are ``trusted``: data only the user or their tenant can write, and
   never what the call itself sent (a search that echoes its query vouches for nothing), or
3. is a **known value** for the argument's kind (added by an approver or an admin, never by
   a model), of the tenant or of the caller alone.

Values are compared exactly (``comparison``): only the same value endorses, never one that
folds to the same letters, and only as a whole token. A value with invisible characters, or
whose host has no ASCII form, is never endorsed, and its reason says why. A value several
sources hold is named by the first that holds it, cheapest first: the task, the known
values, the trusted results. An array argument is endorsed when each of its items is.

``x-endorsed: links`` judges free text: every URL, e-mail address, host name and IP address
found in it (``comparison.links``) must be endorsed on its own; the rest of the text is not
judged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple

from app import evidence
from app.catalog.models import Endorsed
from app.catalog.trusted import WHOLE, FieldPath, trusted_values
from app.runs import comparison, provenance
from app.runs.comparison import Kind

Source = Literal["task", "trusted_result", "known"]
MAX_TRUSTED_CHARS = 262_144
"""How much of its trusted results a run keeps to endorse values by (their values' forms).
Past it,
later trusted results endorse nothing: a value they alone hold needs an approval."""
SOURCES: tuple[Source, ...] = ("task", "trusted_result", "known")


class Text:
    """A source's text in comparison form (``comparison.form``): a task, or a trusted
    result's values, one a line (``formed``), so no match spans two of them."""

    __slots__ = ("_form",)

    def __init__(self, formed: str) -> None:
        self._form = formed

    @classmethod
    def stored(cls, formed: str) -> Text:
        """A text stored in comparison form (``formed``)."""
        return cls(formed)

    def holds(self, value: str, kind: Kind) -> bool:
        """Whether the value whose form is ``value`` occurs here (``comparison.occurs``)."""
        return comparison.occurs(value, kind, self._form)


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


def formed(values: Iterable[str]) -> str:
    """How texts are stored to be judged against later (``Text.stored``): each in
    comparison form, one a line (a form never holds a line break)."""
    return "\n".join(map(comparison.form, values))


class Told(NamedTuple):
    """What one result tells its run of its strings (``told``)."""

    vouched: str | None
    """What its trusted fields vouch for, stored (``formed``); ``None``: nothing."""
    windows: set[int] | None
    """The windows of its other strings, which taint; ``None``: more than a run keeps."""


def told(result: Any, trusted: tuple[FieldPath, ...], arguments: Any, succeeded: bool) -> Told:
    """What a result tells its run: the values at its tool's ``trusted`` fields, when it
    succeeded, endorse later values (``trusted_text``); every other string taints later
    arguments by its windows (``provenance.remembered``; not those that only echo the
    call's own ``arguments``). A refusal is never trusted: ``trusted`` vouches for the
    tool's data, while a provider's error text may quote anything, an outsider's included."""
    if result is None:
        return Told(None, set())
    vouched = trusted_text(result, trusted, arguments) or None if trusted and succeeded else None
    if trusted == WHOLE and succeeded:
        return Told(vouched, set())
    vouching = trusted_values(result, trusted) if succeeded else []
    return Told(
        vouched, provenance.remembered(result, provenance.MAX_WINDOWS, [arguments, vouching])
    )


def trusted_text(result: Any, trusted: tuple[FieldPath, ...], arguments: Any) -> str:
    """What a trusted result vouches for, stored (``formed``): each value at its trusted
    fields, except those that hold, as a whole token, a value the call itself sent (a
    search that echoes its query vouches for nothing). Empty: nothing."""
    sent = [comparison.compared(s)[:2] for s in trusted_values(arguments, WHOLE)]
    kept = []
    for value in trusted_values(result, trusted):
        text = comparison.form(value)
        if text and not any(comparison.occurs(v, k, text) for v, k in sent):
            kept.append(text)
    return "\n".join(kept)


class Sources(NamedTuple):
    """What can endorse a call's values, looked up for it."""

    task: Text | None
    """The run's task; ``None`` outside a run, or for a run without one."""
    trusted: tuple[Text, ...]
    """Trusted results returned earlier in the run."""
    known: frozenset[tuple[str, str]]
    """The candidates (``candidates``: kind and form) that are known values for the caller."""


class Endorsement(NamedTuple):
    """What endorses an ``x-endorsed`` argument, or why nothing does."""

    argument: str
    source: Source | None
    """What endorses it (for ``links`` or a list, what endorses its first item); ``None``:
    not endorsed, or nothing in it needed endorsing (``endorsed`` tells)."""
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


class _Item(NamedTuple):
    """One value to judge: a whole value, a list's item or a link of a text."""

    form: str | None
    kind: Kind
    flaw: str | None


def _items(arg: Endorsed, value: Any) -> list[list[_Item]]:
    """The argument's values to judge, by list item (one entry unless ``many``): a whole
    value, or each link of a ``links`` text. ``null`` and booleans have nothing to judge."""
    entries = value if arg.many and isinstance(value, list) else [value]
    found: list[list[_Item]] = []
    for entry in entries:
        if entry is None or isinstance(entry, bool):
            found.append([])
            continue
        text = entry if isinstance(entry, str) else str(entry)
        if arg.mode == "links":
            found.append([_Item(j.form, j.kind, j.flaw) for j in comparison.links(text)])
            continue
        value = comparison.compared(text)
        found.append([_Item(None if value.flaw else value.form, value.kind, value.flaw)])
    return found


def candidates(endorsed: Iterable[Endorsed], arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every ``(kind, form)`` a known value could endorse for the call: each value of a
    ``value`` argument (each item of a list), each link of a ``links`` argument. Absent,
    empty and never-endorsed values have nothing to look up."""
    return [
        (arg.kind, item.form)
        for arg in endorsed
        for entry in _items(arg, arguments.get(arg.argument))
        for item in entry
        if item.form
    ]


def judge(
    endorsed: Iterable[Endorsed], arguments: Mapping[str, Any], sources: Sources | None
) -> tuple[Endorsement, ...]:
    """Each present ``x-endorsed`` argument's endorsement. With no ``sources`` (none could
    be looked up) nothing is endorsed: fail closed."""
    found = []
    for arg in endorsed:
        if arguments.get(arg.argument) is None:
            continue
        entries = _items(arg, arguments[arg.argument])
        judged = [[(i, _source(arg.kind, i, sources)) for i in entry] for entry in entries]
        failing = [n for n, entry in enumerate(judged) if any(s is None for _, s in entry)]
        if not failing:
            first = next((s for entry in judged for _, s in entry), None)
            found.append(Endorsement(arg.argument, first, True))
        else:
            found.append(Endorsement(arg.argument, None, False, _why(arg, judged, failing)))
    return tuple(found)


def _source(kind: str, item: _Item, sources: Sources | None) -> Source | None:
    if sources is None or item.form is None:
        return None
    if sources.task is not None and sources.task.holds(item.form, item.kind):
        return "task"
    if (kind, item.form) in sources.known:  # before the trusted texts: it costs nothing
        return "known"
    if any(text.holds(item.form, item.kind) for text in sources.trusted):
        return "trusted_result"
    return None


def _why(arg: Endorsed, judged: list[list[tuple[_Item, Source | None]]], failing: list[int]) -> str:
    """Why the argument is not endorsed, in words an approver reads: which of its items or
    links are not, and what keeps one from ever being endorsed (never a value)."""
    items = [item for n in failing for item, source in judged[n] if source is None]
    which = f"items {', '.join(map(str, failing))}" if arg.many else "its value"
    if any(item.flaw == comparison.TOO_MANY for item in items):
        return f"{which} {comparison.TOO_MANY}"
    if arg.mode == "links":
        of = sum(len(entry) for entry in judged)
        whose = f" of {which}" if arg.many else ""
        subject = f"{len(items)} of the {of} links{whose} are"
    else:
        subject = f"{which} {'are' if arg.many else 'is'}"
    flaws = sorted({f"one {item.flaw}" for item in items if item.flaw})
    why = f"{subject} not in the run's task, not from a trusted result, and not a known {arg.kind}"
    return "; ".join([why, *flaws])
