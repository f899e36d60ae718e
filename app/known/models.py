"""What ``/known-values`` answers, as the OpenAPI document describes it."""

from __future__ import annotations

from typing import Literal

from typing_extensions import TypedDict

from app.calls.answers import Timestamp


class KnownValue(TypedDict):
    """``PUT /known-values/{kind}/{value}``: the value as kept, in the form it is compared
    in (case folded, spacing collapsed); ``value`` is ``null`` for a kind that endorses a
    sensitive argument (only its keyed digest is kept)."""

    kind: str
    digest: str
    value: str | None


class Forgotten(TypedDict):
    kind: str
    digest: str
    removed: bool


class KnownItem(TypedDict):
    """A value that endorses now: for the whole tenant (``scope: tenant``, ``user`` null),
    or only the calls of ``user`` (``scope: user``: an approver vouched for it on their own
    call). ``call_id``: the call whose approvers vouched for it (null: an admin's);
    ``until``: while that call has not started, when its approvals lapse, and the value with
    them (null: known for good)."""

    kind: str
    digest: str
    value: str | None
    scope: Literal["tenant", "user"]
    user: str | None
    added_by: str
    added_at: Timestamp
    call_id: str | None
    until: Timestamp | None


class KnownPage(TypedDict):
    """``GET /known-values/{kind}``: in digest order; ``next_cursor`` null on the last page."""

    items: list[KnownItem]
    next_cursor: str | None
