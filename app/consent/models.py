"""A human's decision on a call, as stored: what an approval binds (``Binding``), the
approval's row, and a request as an approver's inbox lists it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

from app import evidence
from app.catalog.models import Impact
from app.evidence import Binding, EndorsementItem, Taint, Target

BindingPart = Literal[
    "actor", "tenant", "tool", "target", "policy_version", "fingerprint", "snapshot_hash"
]
BINDING_PARTS: tuple[tuple[str, BindingPart], ...] = (
    ("actor", "actor"),
    ("tenant", "tenant"),
    ("tool", "tool"),
    ("target", "target"),
    ("policy_version", "policy_version"),
    ("arguments", "fingerprint"),
    ("snapshot_hash", "snapshot_hash"),
)
"""What an approval binds, by the name the API gives each part in ``mismatch``."""


def differences(bound: Binding, other: Binding) -> list[str]:
    """The API's names of the parts of two bindings that differ."""
    return [name for name, part in BINDING_PARTS if bound[part] != other[part]]


class ApprovalRow(NamedTuple):
    id: str
    call_id: str
    decision: Literal["approve", "reject"]
    approver: str
    comment: str | None
    actor: str
    tenant: str
    tool: str
    target_type: str | None
    target_id: str | None
    policy_version: str
    fingerprint: str
    snapshot_hash: str | None
    expires_at: datetime
    consumed_by: str | None = None
    consumed_at: datetime | None = None
    created_at: datetime | None = None
    latest: bool = True
    remember: list[str] | None = None
    """The ``x-endorsed`` arguments the approver asked to remember (``POST /approve``)."""

    @property
    def binding(self) -> Binding:
        return Binding(
            actor=self.actor,
            tenant=self.tenant,
            tool=self.tool,
            target=evidence.target(self.target_type, self.target_id),
            policy_version=self.policy_version,
            fingerprint=self.fingerprint,
            snapshot_hash=self.snapshot_hash,
        )


@dataclass(frozen=True)
class InboxRow:
    """One approval request as an approver's inbox lists it: the call, its latest preview,
    and where the request stands (``pending``, ``approved``, ``rejected``, ``expired``)."""

    call_id: str
    tool: str
    actor: str
    tenant: str
    target_type: str | None
    target_id: str | None
    arguments: dict[str, Any] | None
    impact: Impact | None
    snapshot: Any
    snapshot_hash: str | None
    requested_at: datetime
    expires_at: datetime | None
    status: Literal["pending", "approved", "rejected", "expired"]
    taint: list[Taint] | None
    endorsement: list[EndorsementItem] | None
    given: int
    """Approvers who approved its preview (live, or used by its execution)."""

    @property
    def target(self) -> Target | None:
        return evidence.target(self.target_type, self.target_id)
