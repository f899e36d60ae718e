"""How endorsement compares a value with what vouches for it: exactly. Pure; no I/O.

Taint (``provenance``) errs toward suspicion, so it folds a value hard: letters and digits
only, accents off. Endorsement vouches, so it errs toward exactness: a value is endorsed only
by the *same* value, never by one that merely folds to the same letters (``bob@acme.co`` is
not ``bob@acme.com``, ``acmé.com`` is not ``acme.com``).

**Form** (``form``), the same for a value and for the text it is looked for in: NFC, case
folded, runs of whitespace made one space, nothing else dropped. Every URL, e-mail address
and host name in it (``links``) is written by its parts: scheme and host lower-cased, the
host in its ASCII form (IDNA 2008 with the UTS #46 mapping, non-transitional, by the
``idna`` package: ``acmé.com`` is ``xn--acm-dma.com``, while ``evil.com`` written in
full-width letters is ``evil.com``, the same host for every resolver), IP addresses in their
canonical text. Accents, marks, compatibility letters outside a host, and punctuation stay
significant.

**Invisible characters** (``compared``): a value holding a default-ignorable, format or control
character (a zero-width space, a soft hyphen, a bidi control, a variation selector) is never
endorsed: IDNA would drop some of them, and none is anything a person can check.

**Whole tokens** (``occurs``): a value occurs in a text only where it is bounded on each side
by the text's start or end, whitespace, or a character that cannot continue it. Letters,
digits, marks, ``.``, ``-``, ``_``, ``+`` and ``@`` continue any value (for a URL, anything
but whitespace and ``<>"`` continues it); closing punctuation (a sentence's final ``.``, a
Markdown ``*`` or ``_``, a bracket) followed by whitespace or the end does not, and nor does
opening punctuation after whitespace. There is no matching inside a longer token, at any
length.

**Groups** (``occurs``): a value of letters and digits only, holding a digit (an IBAN, a card
or account number), also matches a *run* written in groups separated by single spaces or
hyphens (``DE89 3704 0044 0532 0130 00``), and only a whole run: the part before and after it
(space-separated) must not continue it. A part continues a run when it holds a digit, or is
four letters between parts that hold digits (a bank code: ``GB33 BUKB 2020 …``). So neither
``3704`` nor ``DE8937040044`` is endorsed by the IBAN above.
"""

from __future__ import annotations

import ipaddress
import unicodedata
from collections.abc import Iterable, Iterator
from functools import lru_cache
from itertools import islice
from typing import Literal, NamedTuple

import idna
import regex
from publicsuffixlist import PublicSuffixList

Kind = Literal["url", "email", "host", "ip", "text"]

INVISIBLE = "contains invisible characters"
UNMAPPABLE = "holds a host name that cannot be written in ASCII (IDNA)"
COMPATIBILITY = "holds a link written in compatibility characters"
TOO_MANY = "holds more links than are judged one by one"
MAX_LINKS = 1000
"""Links a free text may hold to be judged one by one; one with more is never endorsed
(judging each costs a lookup, and no message a person reads holds that many)."""

DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
"""Unicode's default-ignorable code points (DerivedCoreProperties), which render as nothing;
some are letters (a Hangul filler), so categories alone would miss them."""
_INVISIBLE_CLASS = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in DEFAULT_IGNORABLE)
_INVISIBLE = regex.compile(f"[{_INVISIBLE_CLASS}\\p{{Cf}}\\p{{Co}}\\p{{Cn}}]|(?!\\s)\\p{{Cc}}")
"""What renders as nothing or is no character yet: default-ignorable and format characters,
private-use and unassigned code points, and control characters other than whitespace."""


class Compared(NamedTuple):
    """A value as endorsement compares it (``compared``)."""

    form: str
    kind: Kind
    """What it is: one link the whole value makes, or ``text``."""
    flaw: str | None
    """Why it can never be endorsed, in words an approver reads; ``None``: it can be."""


def compared(value: str) -> Compared:
    """``value``'s form, kind and flaw, in one pass. A value holding an invisible or a
    control character other than whitespace, a host with no ASCII form, or more than
    ``MAX_LINKS`` links is flawed. Values up to ``_CACHED`` characters are remembered: a
    call's values are judged, and looked up as known values, more than once."""
    return _compared_cached(value) if len(value) <= _CACHED else _compared(value)


_CACHED = 1000


@lru_cache(maxsize=4096)
def _compared_cached(value: str) -> Compared:
    return _compared(value)


def _compared(value: str) -> Compared:
    nfc = unicodedata.normalize("NFC", value)
    flaw = INVISIBLE if _INVISIBLE.search(nfc) else None
    nfc = " ".join(nfc.split())
    found = list(islice(_found(nfc), MAX_LINKS + 1))
    if len(found) > MAX_LINKS:
        return Compared("", "text", TOO_MANY)
    if flaw is None and any(link.form is None for link in found):
        flaw = UNMAPPABLE
    whole = len(found) == 1 and found[0].start == 0 and found[0].end == len(nfc)
    return Compared(_formed(nfc, found), found[0].kind if whole else "text", flaw)


# --- links ------------------------------------------------------------------------------

_WORD = r"\p{L}\p{M}\p{N}"
_DOT = "[.\u3002\uff0e\uff61]"
_SYMBOL = r"\p{So}"
"""Symbols a label may hold all the same (``☃.com``): no valid IDNA name, so such a host is
found and never endorsed."""
_LABEL = f"[{_WORD}{_SYMBOL}][{_WORD}{_SYMBOL}_-]*+"
_HOST = f"{_LABEL}(?:{_DOT}{_LABEL})+"
_ATOM = f"[{_WORD}!#$%&'*+/=?^_`{{|}}~-]++"
_LOCAL = f'(?:"[^"\\s@]{{1,64}}"|{_ATOM}(?:\\.{_ATOM})*+)'
_IP6 = r"\[?(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?:%[0-9a-z]+)?\]?"
_FINDER = regex.compile(
    rf"""
    (?P<url>(?<![{_WORD}+.-])[a-z][a-z0-9+.-]*+://[^\s<>"`]++)
    | (?P<email>(?<![{_WORD}!#$%&'*+/=?^_`{{|}}~.-]){_LOCAL}@{_HOST})
    | (?P<ip6>(?<![{_WORD}:]){_IP6}(?![{_WORD}:]))
    | (?<![{_WORD}{_SYMBOL}_-])[_-]*+(?P<host>{_HOST})
    """,
    regex.IGNORECASE | regex.VERBOSE,
)
_IPV4 = regex.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
_TRAILING = ".,;:!?'\"*_~"
_SUFFIXES = PublicSuffixList(accept_unknown=False)


class Link(NamedTuple):
    """A URL, e-mail address, host name or IP address found in a text."""

    start: int
    end: int
    kind: Kind
    form: str | None
    """Its comparison form; ``None`` when its host cannot be mapped to ASCII."""


def host_form(host: str) -> str | None:
    """A host name or IP address as endorsement compares it, or ``None`` when IDNA refuses
    it (a label no registry would take)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        pass
    try:
        mapped = idna.uts46_remap(host, std3_rules=False, transitional=False)
        labels = [
            label if label.isascii() else idna.alabel(label).decode() for label in mapped.split(".")
        ]
    except (idna.IDNAError, UnicodeError, ValueError):
        return None
    return ".".join(labels)


def _is_host(found: str) -> bool:
    """Whether ``found`` names a host: under a public suffix (``report.txt`` is a file) or
    an IPv4 address."""
    if _IPV4.fullmatch(found):
        try:
            ipaddress.IPv4Address(found)
        except ValueError:
            return False
        return True
    mapped = host_form(found)
    if mapped is None:  # judged all the same when its suffix is a public one (``☃.com``)
        mapped = host_form(regex.split(_DOT, found)[-1])
        if mapped is None:
            return False
    return _SUFFIXES.publicsuffix(mapped) is not None


def _url_form(url: str) -> str | None:
    scheme, _, rest = url.partition("://")
    end = next((i for i, c in enumerate(rest) if c in "/?#\\"), len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    host, port = hostport, ""
    if hostport.startswith("["):
        close = hostport.find("]")
        host, port = (hostport[: close + 1], hostport[close + 1 :]) if close > 0 else (hostport, "")
    elif ":" in hostport:
        host, colon, port = hostport.rpartition(":")
        port = colon + port
    mapped = host_form(host) if host else ""
    if mapped is None:
        return None
    if ":" in mapped:
        mapped = f"[{mapped}]"
    return f"{scheme.lower()}://{userinfo.casefold()}{at}{mapped}{port}{tail.casefold()}"


def _balanced(url: str) -> str:
    """A URL without the punctuation that ends the sentence around it: trailing ``.,;:!?``
    quotes and Markdown marks, and closing brackets it did not open."""
    while url:
        last = url[-1]
        if last in _TRAILING:
            url = url[:-1]
        elif last in ")]}>":
            if url.count({")": "(", "]": "[", "}": "{", ">": "<"}[last]) >= url.count(last):
                break
            url = url[:-1]
        else:
            break
    return url


def _found(text: str) -> Iterator[Link]:
    """The links of an NFC ``text``, in order, each with its comparison form."""
    for match in _FINDER.finditer(text):
        kind = match.lastgroup
        start, written = match.start(kind), match.group(kind)
        if kind in ("email", "host"):
            written = written.rstrip("_-")  # Markdown's ``_evil.com_``, a dash after a host
        end = start + len(written)
        if kind == "url":
            written = _balanced(written)
            if "://" not in written or written.endswith("://"):
                continue
            yield Link(start, start + len(written), "url", _url_form(written))
        elif kind == "email":
            local, _, host = written.rpartition("@")
            mapped = host_form(host)
            email = None if mapped is None else f"{local.casefold()}@{mapped}"
            yield Link(start, end, "email", email)
        elif kind == "ip6":
            mapped = host_form(written)
            if mapped is not None and ":" in mapped:
                yield Link(start, end, "ip", mapped)
        elif _is_host(written):
            mapped = host_form(written)
            kind_of: Kind = "ip" if mapped is not None and _IPV4.fullmatch(mapped) else "host"
            yield Link(start, end, kind_of, mapped)


class Judged(NamedTuple):
    """A link of a free text, as ``links`` finds it to be judged."""

    form: str | None
    """Its comparison form; ``None`` when it has none (``flaw`` says why)."""
    kind: Kind
    flaw: str | None = None
    span: tuple[int, int] | None = None
    """Where it is in the text (NFC); ``None`` for a link only NFKC reveals."""


def links(text: str) -> list[Judged]:
    """Every URL, e-mail address, host name and IP address in a free ``text``, to be judged
    one by one, found as an attacker would hide them: written with invisible characters
    inside (found without them, and never endorsed), in full-width or other compatibility
    forms (a link only NFKC reveals is never endorsed), with IDNA's dot variants, in Markdown
    or punctuation. Suspicion may fold: more found is more judged."""
    nfc = unicodedata.normalize("NFC", text)
    visible, where = _without_invisible(nfc)
    judged: list[Judged] = []
    found = list(islice(_found(visible), MAX_LINKS + 1))
    if len(found) > MAX_LINKS:
        return [Judged(None, "text", TOO_MANY)]
    for link in found:
        hidden = where[link.end - 1] - where[link.start] != link.end - 1 - link.start
        reason = INVISIBLE if hidden else (UNMAPPABLE if link.form is None else None)
        span = (where[link.start], where[link.end - 1] + 1)
        judged.append(Judged(None if reason else link.form, link.kind, reason, span))
    seen = {j.form for j in judged}
    compatible = unicodedata.normalize("NFKC", visible)
    if compatible != visible:
        for link in islice(_found(compatible), MAX_LINKS):
            if link.form not in seen:
                judged.append(Judged(None, link.kind, COMPATIBILITY))
                seen.add(link.form)
    return judged


def _without_invisible(text: str) -> tuple[str, list[int]]:
    """``text`` without its invisible characters, and where each kept character was."""
    where = [i for i, c in enumerate(text) if not _INVISIBLE.match(c)]
    return "".join(text[i] for i in where), where


# --- form -------------------------------------------------------------------------------


def form(text: str) -> str:
    """``text`` as endorsement compares it (see the module's docstring). Idempotent."""
    nfc = " ".join(unicodedata.normalize("NFC", text).split())
    if nfc.isascii() and "." not in nfc and ":" not in nfc:
        return nfc.lower()  # no link without a dot or a colon
    return _formed(nfc, _found(nfc))


def _formed(nfc: str, found: Iterable[Link]) -> str:
    """An NFC ``text`` with spacing collapsed, its ``found`` links written in their form and
    the rest case folded."""
    parts: list[str] = []
    at = 0
    for link in found:
        parts.append(nfc[at : link.start].casefold())
        parts.append(link.form if link.form is not None else nfc[link.start : link.end].casefold())
        at = link.end
    parts.append(nfc[at:].casefold())
    return "".join(parts)


# --- occurrence -------------------------------------------------------------------------

_CONTINUES = f"[{_WORD}._+@-]"
_OPENING = "[(\\[{<'\"*_~]"
_CLOSING = "[.,;:!?)\\]}>'\"*_~]"
_BEFORE = f"(?:(?<!{_CONTINUES})|(?<=(?:^|\\s){_OPENING}{{1,8}}))"
_AFTER = {
    "text": f"(?:(?!{_CONTINUES})|(?={_CLOSING}{{1,8}}(?:\\s|$)))",
    "url": f'(?:(?![^\\s<>"`])|(?={_CLOSING}{{1,8}}(?:\\s|$)))',
}
_ALNUM = regex.compile(r"[\p{L}\p{N}]+")
_GROUPS = regex.compile(r"[\p{L}\p{N}]+(?:[ -][\p{L}\p{N}]+)*")
_PART = f"[{_WORD}]+(?:-[{_WORD}]+)*"
_PART_BEFORE = regex.compile(f"(?:^|(?<=\\s))(?:({_PART}) )?({_PART}) $")
_PART_AFTER = regex.compile(f"^ ({_PART})(?: ({_PART})(?=\\s|$))?")
_DIGIT = regex.compile(r"\p{N}")
_NEAR = 200
"""How far around a run its neighbouring parts are looked for."""


@lru_cache(maxsize=4096)
def _token(value: str, kind: Kind) -> regex.Pattern[str]:
    after = _AFTER["url" if kind == "url" else "text"]
    return regex.compile(f"{_BEFORE}{regex.escape(value)}{after}")


@lru_cache(maxsize=4096)
def _run(value: str) -> regex.Pattern[str]:
    spaced = "[ -]?".join(map(regex.escape, value))
    return regex.compile(f"{_BEFORE}{spaced}{_AFTER['text']}")


def occurs(value: str, kind: Kind, text: str) -> bool:
    """Whether the value whose form is ``value`` (a ``kind``) occurs in a text whose form is
    ``text`` as a whole token; letters and digits with a digit, in groups or not, only as
    a whole run (joined, they also match the run written in groups)."""
    if not value:
        return False
    if kind != "text" or not (_DIGIT.search(value) and _GROUPS.fullmatch(value)):
        return _token(value, kind).search(text) is not None
    pattern = _run(value) if _ALNUM.fullmatch(value) else _token(value, kind)
    return any(_whole_run(text, m.start(), m.end()) for m in pattern.finditer(text))


def _whole_run(text: str, start: int, end: int) -> bool:
    before = _PART_BEFORE.search(text[max(0, start - _NEAR) : start])
    after = _PART_AFTER.match(text[end : end + _NEAR])
    if (before and before.start() == 0 and start > _NEAR) or (after and after.end() == _NEAR):
        return False  # a part too long to see whole: fail closed
    return not (
        (before and _continues(before.group(2), before.group(1)))
        or (after and _continues(after.group(1), after.group(2)))
    )


def _continues(part: str, beyond: str | None) -> bool:
    """Whether ``part``, next to a run (``beyond`` it, the part after it), belongs to the
    run: it holds a digit, or it is four letters with digits beyond (a bank code)."""
    if _DIGIT.search(part):
        return True
    return len(part) == 4 and beyond is not None and _DIGIT.search(beyond) is not None
