"""Endorsement's exact comparison (``app.runs.comparison``): only the same value endorses,
never a lookalike; and every link a free text holds is found, checked against an
independent linkifier (``linkify-it-py``) as the oracle. Pure; property-based."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from linkify_it import LinkifyIt
from linkify_it.tlds import TLDS

from app.catalog.models import Endorsed
from app.runs import comparison, endorsement
from app.runs.comparison import compared, form, links, occurs

CORPUS = Path(__file__).parent / "data" / "messages.txt"


def endorsed_by(value: str, source: str) -> bool:
    value_form, kind, flaw = compared(value)
    return flaw is None and occurs(value_form, kind, form(source))


# --- the value's form ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lookalike", "of"),
    [
        ("bob@acme.co", "bob@acme.com"),
        ("bo@bacme.com", "bob@acme.com"),
        ("bob@acmec.om", "bob@acme.com"),
        ("to@bobacme.com", "bob@acme.com"),
        ("bob@acmé.com", "bob@acme.com"),
        ("bob@acme.com\u200b", "bob@acme.com"),
        ("bob@acme.com\u00ad", "bob@acme.com"),
        ("b\u202eob@acme.com", "bob@acme.com"),
        ("bob@аcme.com", "bob@acme.com"),  # a Cyrillic a
        ("alicecorp@example", "alice@corp.example"),
        ("ac.me", "our site is acme.com"),
        ("acme.com.evil.io", "acme.com"),
        ("https://acme.com.evil.io/pay", "https://acme.com/pay"),
        ("https://acme.com@evil.io/", "https://acme.com/"),
        ("https://acme.com/pay?to=eve", "https://acme.com/pay"),
        ("DE8937040044", "DE89 3704 0044 0532 0130 00"),
        ("3704 0044 0532 0130 00", "DE89 3704 0044 0532 0130 00"),
        ("20201555555555", "GB33 BUKB 2020 1555 5555 55"),
        ("10.0.0.12", "10.0.0.1"),
    ],
)
def test_a_lookalike_is_not_endorsed(lookalike: str, of: str) -> None:
    assert not endorsed_by(lookalike, f"Please send it to {of}.")


@pytest.mark.parametrize(
    ("value", "source"),
    [
        ("Bob@ACME.com", "Send the March invoice to bob@acme.com."),
        ("acmé.com", "our shop is at ACMÉ.com"),
        ("xn--acm-dma.com", "our shop is at acmé.com"),  # the same host, in ASCII
        ("evil.com", "ｅｖｉｌ．ｃｏｍ"),  # full-width: the same host for every resolver
        ("пример.рф", "see https://пример.рф/путь"),
        ("DE89370400440532013000", "IBAN DE89 3704 0044 0532 0130 00, thanks"),
        ("GB33BUKB20201555555555", "to GB33 BUKB 2020 1555 5555 55."),
        ("de89 3704 0044 0532 0130 00", "send 100 to DE89 3704 0044 0532 0130 00 today"),
        ("Alice Smith", "Pay  Alice\nSmith."),
        ("alice", "(alice)"),
        ("evil.com", "_evil.com_"),
        ("https://acme.com/pay", "see <https://acme.com/pay>."),
        ("2001:db8::1", "host [2001:0db8:0:0::1] now"),
    ],
)
def test_the_same_value_is_endorsed_however_it_is_cased_spaced_or_framed(
    value: str, source: str
) -> None:
    assert endorsed_by(value, source)


def test_runs_of_digits_next_to_the_match_keep_it_from_being_a_whole_run() -> None:
    assert not endorsed_by("DE89370400440532013000", "DE89 3704 0044 0532 0130 00 12 EUR")
    assert endorsed_by("DE89370400440532013000", "DE89 3704 0044 0532 0130 00 and 12 EUR")
    assert not endorsed_by("20240042", "invoice INV-2024-0042")


def test_a_value_that_cannot_be_compared_says_why() -> None:
    assert compared("bob\u200d@acme.com").flaw == comparison.INVISIBLE
    assert compared("pay \x00 now").flaw == comparison.INVISIBLE
    assert compared("see ☃.com").flaw == comparison.UNMAPPABLE
    assert compared("bob@acme.com").flaw is None
    assert compared("tab\tand\nnewline").flaw is None


# --- properties -----------------------------------------------------------------------------

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_label = st.text(_LETTERS + "0123456789", min_size=1, max_size=8)
_hosts = st.builds(
    lambda labels, tld: ".".join([*labels, tld]),
    st.lists(_label, min_size=1, max_size=3),
    st.sampled_from(["com", "io", "co.uk", "de", "org", "рф", "example"]),
)
_values = st.one_of(
    _hosts,
    st.builds(lambda local, host: f"{local}@{host}", _label, _hosts),
    st.builds(lambda host, path: f"https://{host}/{path}", _hosts, _label),
    st.text(_LETTERS + "0123456789", min_size=2, max_size=24),  # an account, an IBAN
    st.builds(lambda a, b: f"{a} {b}", _label, _label),  # a name
    st.builds(lambda a, b: f"{a}-{b}", _label, _label),
)
_ACCENT = "\u0301"
_INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u00ad", "\u2060", "\ufeff", "\u202e", "\ufe0f"]
_CONFUSABLE = {"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х", "i": "і", "l": "ӏ"}
_INSERTED = [*_LETTERS, *"0123456789", ".", "@", "-", _ACCENT, *_INVISIBLE]


@st.composite
def _edited(draw: st.DrawFn) -> tuple[str, str]:
    """A value and one edit of it: insert, delete or replace one letter, digit, ``.``,
    ``@``, ``-``, an accent or an invisible character, or swap a letter for a lookalike
    of another script."""
    value = draw(_values)
    at = draw(st.integers(0, len(value)))
    what = draw(st.sampled_from(["insert", "delete", "replace", "confusable"]))
    if what == "insert":
        return value, value[:at] + draw(st.sampled_from(_INSERTED)) + value[at:]
    at = min(at, len(value) - 1)
    if what == "delete":
        return value, value[:at] + value[at + 1 :]
    if what == "replace":
        return value, value[:at] + draw(st.sampled_from(_INSERTED)) + value[at + 1 :]
    swappable = [i for i, c in enumerate(value) if c in _CONFUSABLE]
    assume(swappable)
    i = draw(st.sampled_from(swappable))
    return value, value[:i] + _CONFUSABLE[value[i]] + value[i + 1 :]


def _same_but_case_or_composition(a: str, b: str) -> bool:
    def folded(s: str) -> str:
        return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", s).casefold())

    return folded(a) == folded(b)


def _joins_groups(value: str, edited: str) -> bool:
    """The edit took out the only separator of a grouped number: the grouped run rule
    endorses its letters and digits joined, on purpose (an IBAN written in groups)."""
    return (
        len(edited) == len(value) - 1
        and edited.isalnum()
        and any(c.isdigit() for c in edited)
        and sum(c in " -" for c in value) == 1
    )


def _fewer_words(value: str, edited: str) -> bool:
    """The edit took a whole word off a value of several: the words the user wrote are
    whole tokens of their own (``Smith`` of "Alice Smith")."""
    words, left = value.split(), edited.split()
    return len(left) < len(words) and " ".join(left) in {
        " ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)
    }


@settings(max_examples=1000, deadline=None)
@given(_edited())
@example(("bob@acme.com", "bob@acme.co"))
@example(("bob@acme.com", "bob@acme.com\u200b"))
@example(("acme.com", "acmé.com"))
def test_no_single_edit_of_a_value_is_endorsed_by_a_source_that_holds_only_the_value(
    pair: tuple[str, str],
) -> None:
    value, edited = pair
    assume(not _same_but_case_or_composition(value, edited))
    assume(not _joins_groups(value, edited))
    assume(not _fewer_words(value, edited))
    assert endorsed_by(value, value)
    for source in (value, f"« {value} ».", f"Send it to {value}, please"):
        assert not endorsed_by(edited, source), (value, edited, source)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=60))
def test_the_form_is_idempotent(text: str) -> None:
    assert form(form(text)) == form(text)


# --- every link found: linkify-it as the oracle ---------------------------------------------

_ORACLE = LinkifyIt().tlds(TLDS)


def assert_every_link_judged(text: str) -> None:
    """Each link the oracle finds is one toolgate judges: the same host, or a link of
    toolgate's that overlaps it (the oracle may stop short: ``http://0`` of
    ``http://0。com``), or one toolgate cannot compare (never endorsed)."""
    text = unicodedata.normalize("NFC", text)
    judged = links(text)
    hosts = {_host(link) for link in judged if link.form is not None}
    flawed = any(link.form is None for link in judged)
    for match in _ORACLE.match(text) or ():
        url = match.url
        if url.startswith("mailto:"):
            host = url.rpartition("@")[2]
        else:
            host = urlsplit(url if "://" in url else "http:" + url).hostname or ""
        covered = any(
            link.span and link.span[0] < match.last_index and match.index < link.span[1]
            for link in judged
        )
        assert comparison.host_form(host) in hosts or covered or flawed, (text, url, judged)


def _host(link: comparison.Judged) -> str:
    assert link.form is not None
    if link.kind == "url":
        return urlsplit(link.form).hostname or ""
    if link.kind == "email":
        return link.form.rpartition("@")[2]
    return link.form.strip("[]")


_TLDS = ["com", "io", "org", "co.uk", "рф", "xn--p1ai", "de", "shop", "md", "py", "museum"]
_host_written = st.builds(
    lambda labels, tld, dot: dot.join([*labels, tld]),
    st.lists(st.text(_LETTERS + "éü0123456789", min_size=1, max_size=8), min_size=1, max_size=3),
    st.sampled_from(_TLDS),
    st.sampled_from([".", ".", ".", "\u3002", "\uff0e", "\uff61"]),
)
_link_written = st.one_of(
    _host_written,
    st.builds(lambda h: f"www.{h}", _host_written),
    st.builds(
        lambda local, h: f"{local}@{h}",
        st.sampled_from(["eve", "évé", '"eve"', "a.b+c"]),
        _host_written,
    ),
    st.builds(
        lambda scheme, h, path: f"{scheme}://{h}/{path}",
        st.sampled_from(["http", "https", "ftp"]),
        _host_written,
        st.text(_LETTERS + "/-_?=&", max_size=10),
    ),
    st.builds(lambda h: f"//{h}/x", _host_written),
    st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", *[st.integers(1, 255)] * 4),
)
_wrapped = st.builds(
    lambda before, link, after: before + link + after,
    st.sampled_from(["", "_", "*", "**", "(", "<", "[x](", '"', "'", "mailto:"]),
    _link_written,
    st.sampled_from(["", "_", "*", "**", ")", ">", ".", ",", "!", "?", ":", ";", '"']),
)
_prose = st.lists(
    st.one_of(
        _wrapped, st.sampled_from(["hello", "please", "see", "e.g.", "report.txt", "1.2.3", "—"])
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=500, deadline=None)
@given(_prose, st.sampled_from([" ", "  ", "\n", " – "]))
def test_every_link_the_oracle_finds_in_generated_text_is_judged(
    words: list[str], separator: str
) -> None:
    assert_every_link_judged(separator.join(words))


def test_every_link_the_oracle_finds_in_real_messages_is_judged() -> None:
    messages = [line for line in CORPUS.read_text().splitlines() if line.strip()]
    assert len(messages) >= 30
    for message in messages:
        assert_every_link_judged(message)


@pytest.mark.parametrize(
    "free",
    [
        "пример.рф",
        "évil.com",
        "evil\u3002com",
        "evil\uff0ecom",
        "evil\uff61com",
        "ｅｖｉｌ．ｃｏｍ",
        "_evil.com_",
        "*evil.com*",
        "[x](https://evil.com)",
        "<evil.com>",
        "(evil.com)",
        "évé@evil.com",
        '"eve"@evil.com',
        "203.0.113.5",
        "[2001:db8::1]",
        "xn--e1afmkfd.xn--p1ai",
    ],
)
def test_the_forms_an_attacker_hides_a_link_in_are_found(free: str) -> None:
    found = links(f"Thanks! Details at {free} today.")
    assert len(found) == 1, found


@pytest.mark.parametrize(
    ("free", "flaw"),
    [
        ("evil\u200b.com", comparison.INVISIBLE),
        ("ｂｏｂ＠ａｃｍｅ．ｃｏｍ", comparison.COMPATIBILITY),
        ("☃.com", comparison.UNMAPPABLE),
    ],
)
def test_a_link_toolgate_cannot_compare_is_judged_and_never_endorsed(free: str, flaw: str) -> None:
    assert flaw in {link.flaw for link in links(f"see {free}")}


def test_text_with_no_link_has_nothing_to_judge() -> None:
    assert links("the file report.txt, e.g. version 1.2.3, at 10:30 — no links") == []


@pytest.mark.parametrize(
    "crafted",
    ["a-" * 50_000, "a." * 50_000, "a+" * 50_000, "_" * 100_000, "x" * 5000 + "@" + "a." * 5000],
)
def test_text_crafted_to_backtrack_is_read_in_one_pass(crafted: str) -> None:
    """Every pattern is possessive where it repeats, so a finder's cost stays linear: a
    quadratic one took minutes on ``a-a-a-…`` of 100,000 characters."""
    links(crafted)
    form(crafted)


def test_a_text_with_more_links_than_are_judged_is_never_endorsed() -> None:
    many = " ".join(f"h{n}.com" for n in range(comparison.MAX_LINKS + 1))
    assert [link.flaw for link in links(many)] == [comparison.TOO_MANY]
    assert compared(many).flaw == comparison.TOO_MANY
    [judged] = endorsement.judge([Endorsed("body", "links", "mail")], {"body": many}, None)
    assert judged.reason == f"its value {comparison.TOO_MANY}"
