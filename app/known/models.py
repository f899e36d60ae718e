"""What ``/known-values`` answers, as the OpenAPI document describes it."""

from __future__ import annotations

from typing_extensions import TypedDict

from app.calls.answers import Timestamp


class KnownValue(TypedDict):
    """``PUT /known-values/{kind}/{value}``: the value as kept; ``value`` is ``null`` for a
    kind that endorses a sensitive argument (only its digest is kept)."""

    kind: str
    digest: str
    value: str | None


class Forgotten(TypedDict):
    kind: str
    digest: str
    removed: bool


class KnownItem(TypedDict):
    kind: str
    digest: str
    value: str | None
    added_by: str
    added_at: Timestamp


class KnownPage(TypedDict):
    """``GET /known-values/{kind}``: in digest order; ``next_cursor`` null on the last page."""

    items: list[KnownItem]
    next_cursor: str | None
