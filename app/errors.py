"""One error hierarchy; each class carries its HTTP status and problem ``code`` (docs/api.md,
Errors).

Services raise these; ``app.main`` renders every one as RFC 9457 problem+json. ``detail``
must never reveal another tenant's data or whether another tenant's resource exists.
Keyword arguments given to an error (``call_id=…``, ``mismatch=[…]``) become members of its
problem document.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ToolgateError(Exception):
    """Anything the service refuses or cannot do on purpose. Raised as itself it is an
    internal error; everything else raises one of the subclasses below."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal error"
    audited: ClassVar[tuple[str, ...]] = ()
    """Members of the problem that its audit row records too (as its ``outcome``); never
    one that could hold an argument's value."""
    recorded: ClassVar[bool] = False
    """A refusal of the call itself, recorded as its decision (a ``denied`` audit row with
    the call's row) wherever authorization or a gate refuses a call with it, whatever its
    status: the policy's denials and the gates' refusals. An error of any other class (a
    malformed request, a dependency down) is counted (``toolgate_refusals``), never recorded
    as a decision. (The same classes answering an approver on ``/approve`` refuse the
    approver, not the call.)"""

    def __init_subclass__(
        cls, *, status: int, code: str, title: str, recorded: bool = False, **kwargs: Any
    ) -> None:
        """Every error class states its HTTP status, problem code and title where it is
        named, and whether it is ``recorded``."""
        super().__init_subclass__(**kwargs)
        cls.status, cls.code, cls.title, cls.recorded = status, code, title, recorded

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def problem(self) -> dict[str, Any]:
        return {
            "type": f"urn:toolgate:error:{self.code}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        }


# --- 400, 413, 431: the request itself ------------------------------------------------------


class InvalidRequest(ToolgateError, status=400, code="invalid_request", title="Invalid request"):
    """The request is malformed: a body that is not the endpoint's shape (unknown fields,
    non-finite numbers, NUL), a bad query parameter or cursor, or an id of the wrong form."""


class ContentTooLarge(
    ToolgateError, status=413, code="invalid_request", title="Request body too large"
):
    """The request body is longer than the body limit; nothing of it is recorded."""


class HeadersTooLarge(
    ToolgateError, status=431, code="invalid_request", title="Request header fields too large"
):
    """The request line and headers are longer than the head limit; raised by the HTTP
    protocol before any application code runs, and nothing is recorded."""


class IdempotencyKeyMissing(
    ToolgateError, status=400, code="idempotency_key_missing", title="Idempotency-Key required"
):
    """A mutation was executed without an ``Idempotency-Key`` header."""


class IdempotencyKeyInvalid(
    ToolgateError, status=400, code="idempotency_key_invalid", title="Idempotency-Key malformed"
):
    """The ``Idempotency-Key`` header is not 16-255 characters of ``[A-Za-z0-9_-]``."""


# --- 401, 403: who is asking, and whether they may -------------------------------------------


class Unauthenticated(
    ToolgateError, status=401, code="unauthenticated", title="Authentication required"
):
    """No bearer token, or one that does not verify (signature, algorithm, expiry, claims)."""


class ToolForbidden(
    ToolgateError, status=403, code="tool_forbidden", title="Tool call forbidden", recorded=True
):
    """A policy denial: the caller's roles do not allow the tool, a resource named in the
    arguments belongs to someone else or does not exist (the two answer the same), or an
    egress argument names a host that is not public."""


class IdentitySpoof(
    ToolgateError, status=403, code="identity_spoof", title="Identity spoof", recorded=True
):
    """A policy denial: an argument annotated ``x-identity`` names someone other than the
    session's own user or tenant."""


class ApprovalRequired(
    ToolgateError, status=403, code="approval_required", title="Approval required", recorded=True
):
    """A high-impact call was executed without an approval, or with one that does not exist
    or was given for another call."""


class ApprovalExpired(
    ToolgateError, status=403, code="approval_expired", title="Approval expired", recorded=True
):
    """The approval presented for execution is past its expiry, or the request for a
    decision an approver answers is past its approval window."""


class ApprovalRejected(
    ToolgateError, status=403, code="approval_rejected", title="Approval rejected", recorded=True
):
    """The call was rejected by an approver; a rejection is final, for execution and for
    any later decision on the same call."""


class TaintedArguments(
    ToolgateError, status=403, code="tainted_arguments", title="Tainted arguments", recorded=True
):
    """A policy denial: in a run, an argument carries a value from an untrusted result (and
    not from the run's task), and the tool's ``on_taint`` is ``deny``; ``taint`` names the
    arguments and the calls whose results held them."""

    audited = ("taint",)


class UnendorsedArguments(
    ToolgateError,
    status=403,
    code="unendorsed_arguments",
    title="Unendorsed arguments",
    recorded=True,
):
    """A policy denial: an ``x-endorsed`` argument's value comes from nobody the user
    trusts (not in the run's task, not from a trusted result, not a known value) and the
    tool's ``on_unendorsed`` is ``deny``; ``endorsement`` names each argument and why."""

    audited = ("endorsement",)


class OutOfScope(
    ToolgateError, status=403, code="out_of_scope", title="Out of scope", recorded=True
):
    """A policy denial: a call in a run names a tool outside the run's scope, and the scope
    refuses such calls (``outside: deny``), or the tool has no approvers to ask."""


class ApproverForbidden(
    ToolgateError, status=403, code="approver_forbidden", title="Approver forbidden"
):
    """The caller may not decide this call: another tenant's call, no approver role the tool
    names, or the caller's own call where the tool does not let owners approve."""


class DryRunRequired(
    ToolgateError, status=403, code="dry_run_required", title="Dry-run required", recorded=True
):
    """The call needs an unexpired dry-run of the same arguments first: before an approver
    decides it, or before a first execution the catalog says must be previewed."""


class Forbidden(ToolgateError, status=403, code="forbidden", title="Forbidden"):
    """Not among the API's error codes (docs/api.md): a role-gated read (the audit trail)
    that the caller's roles or tenant do not allow."""


# --- 404, 409, 422, 429: what the request names, and its state ------------------------------


class UnknownTool(
    ToolgateError, status=404, code="unknown_tool", title="Unknown tool", recorded=True
):
    """A policy denial: the catalog has no tool of that name."""


class NotFound(ToolgateError, status=404, code="not_found", title="Not found"):
    """No such call, run or endpoint visible to the caller (another tenant's looks the same
    as a missing one)."""


class ApprovalMismatch(
    ToolgateError,
    status=409,
    code="approval_mismatch",
    title="Approval does not match",
    recorded=True,
):
    """The approval is bound to something other than what is executed (arguments, tool,
    actor, policy version, preview), or the hash an approver echoes is not the call's latest
    preview; ``mismatch`` lists what differs."""


class ApprovalConsumed(
    ToolgateError,
    status=409,
    code="approval_consumed",
    title="Approval already used",
    recorded=True,
):
    """The approval was already used by another execution, or the call was already decided
    or executed."""


class ApprovalStale(
    ToolgateError, status=409, code="approval_stale", title="Approval stale", recorded=True
):
    """The provider's preview of an approved call changed since the approval: nothing ran, the
    approval is not used, and the call needs a new dry-run and approval."""

    audited = ("approved_snapshot_hash", "current_snapshot_hash")


class IdempotencyInFlight(
    ToolgateError, status=409, code="idempotency_in_flight", title="Request still in flight"
):
    """Another request with the same ``Idempotency-Key`` is still executing."""


class InvalidArguments(
    ToolgateError, status=422, code="invalid_arguments", title="Invalid arguments", recorded=True
):
    """A policy denial: the arguments are not what the tool accepts (its JSON Schema), hold
    values that cannot be recorded or canonicalized, or name resources that cannot be URL
    path segments; ``errors`` says where."""


class IdempotencyKeyReused(
    ToolgateError, status=422, code="idempotency_key_reused", title="Idempotency-Key reused"
):
    """The ``Idempotency-Key`` was already used for a different request (other tool,
    arguments or approval)."""


class RunLimitExceeded(
    ToolgateError, status=429, code="run_limit_exceeded", title="Run limit exceeded"
):
    """The call would take its run past one of the run's limits; the run ends."""


class RepeatedCall(ToolgateError, status=429, code="repeated_call", title="Repeated call"):
    """The run has repeated the same call too often; the run now needs clarification."""


# --- 502, 503, 504: the systems toolgate depends on ------------------------------------------


class ProviderUnavailable(
    ToolgateError, status=502, code="provider_unavailable", title="Provider unavailable"
):
    """The provider was not reached, answered with a body over its limit, or an owner
    lookup failed; for a mutation, only when the provider cannot have acted."""


class Unavailable(ToolgateError, status=503, code="unavailable", title="Service unavailable"):
    """A dependency toolgate needs to decide is down (database, lock service, the token
    issuer's keys): the request fails closed, never as an allow."""


class ProviderTimeout(
    ToolgateError, status=504, code="provider_timeout", title="Provider outcome unknown"
):
    """The provider may have acted but its outcome is unknown (a timeout, or toolgate's own
    failure after sending); the answer carries the operation id for reconciliation."""
