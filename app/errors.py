"""One error hierarchy; each class carries its HTTP status and SPEC §5 ``code``.

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


class InvalidRequest(ToolgateError):
    """The request is malformed: a body that is not the endpoint's shape (unknown fields,
    non-finite numbers, NUL), a bad query parameter or cursor, or an id of the wrong form."""

    status = 400
    code = "invalid_request"
    title = "Invalid request"


class ContentTooLarge(ToolgateError):
    """The request body is longer than the body limit; nothing of it is recorded."""

    status = 413
    code = "invalid_request"
    title = "Request body too large"


class HeadersTooLarge(ToolgateError):
    """The request line and headers are longer than the head limit; raised by the HTTP
    protocol before any application code runs, and nothing is recorded."""

    status = 431
    code = "invalid_request"
    title = "Request header fields too large"


class IdempotencyKeyMissing(ToolgateError):
    """A mutation was executed without an ``Idempotency-Key`` header."""

    status = 400
    code = "idempotency_key_missing"
    title = "Idempotency-Key required"


class IdempotencyKeyInvalid(ToolgateError):
    """The ``Idempotency-Key`` header is not 16-255 characters of ``[A-Za-z0-9_-]``."""

    status = 400
    code = "idempotency_key_invalid"
    title = "Idempotency-Key malformed"


# --- 401, 403: who is asking, and whether they may -------------------------------------------


class Unauthenticated(ToolgateError):
    """No bearer token, or one that does not verify (signature, algorithm, expiry, claims)."""

    status = 401
    code = "unauthenticated"
    title = "Authentication required"


class ToolForbidden(ToolgateError):
    """A policy denial: the caller's roles do not allow the tool, a resource named in the
    arguments belongs to someone else or does not exist (the two answer the same), or an
    egress argument names a host that is not public."""

    status = 403
    code = "tool_forbidden"
    title = "Tool call forbidden"


class IdentitySpoof(ToolgateError):
    """A policy denial: an argument annotated ``x-identity`` names someone other than the
    session's own user or tenant."""

    status = 403
    code = "identity_spoof"
    title = "Identity spoof"


class ApprovalRequired(ToolgateError):
    """A high-impact call was executed without an approval, or with one that does not exist
    or was given for another call."""

    status = 403
    code = "approval_required"
    title = "Approval required"


class ApprovalExpired(ToolgateError):
    """The approval presented for execution is past its expiry."""

    status = 403
    code = "approval_expired"
    title = "Approval expired"


class ApprovalRejected(ToolgateError):
    """The call was rejected by an approver; a rejection is final, for execution and for
    any later decision on the same call."""

    status = 403
    code = "approval_rejected"
    title = "Approval rejected"


class ApproverForbidden(ToolgateError):
    """The caller may not decide this call: another tenant's call, no approver role the tool
    names, or the caller's own call where the tool does not let owners approve."""

    status = 403
    code = "approver_forbidden"
    title = "Approver forbidden"


class DryRunRequired(ToolgateError):
    """The call needs an unexpired dry-run of the same arguments first: before an approver
    decides it, or before a first execution the catalog says must be previewed."""

    status = 403
    code = "dry_run_required"
    title = "Dry-run required"


class Forbidden(ToolgateError):
    """Not in SPEC §5: a role-gated read (the audit trail) that the caller's roles or
    tenant do not allow."""

    status = 403
    code = "forbidden"
    title = "Forbidden"


# --- 404, 409, 422, 429: what the request names, and its state ------------------------------


class UnknownTool(ToolgateError):
    """A policy denial: the catalog has no tool of that name."""

    status = 404
    code = "unknown_tool"
    title = "Unknown tool"


class NotFound(ToolgateError):
    """No such call, run or endpoint visible to the caller (another tenant's looks the same
    as a missing one)."""

    status = 404
    code = "not_found"
    title = "Not found"


class ApprovalMismatch(ToolgateError):
    """The approval is bound to something other than what is executed (arguments, tool,
    actor, policy version, preview), or the hash an approver echoes is not the call's latest
    preview; ``mismatch`` lists what differs."""

    status = 409
    code = "approval_mismatch"
    title = "Approval does not match"


class ApprovalConsumed(ToolgateError):
    """The approval was already used by another execution, or the call was already decided
    or executed."""

    status = 409
    code = "approval_consumed"
    title = "Approval already used"


class IdempotencyInFlight(ToolgateError):
    """Another request with the same ``Idempotency-Key`` is still executing."""

    status = 409
    code = "idempotency_in_flight"
    title = "Request still in flight"


class InvalidArguments(ToolgateError):
    """A policy denial: the arguments are not what the tool accepts (its JSON Schema), hold
    values that cannot be recorded or canonicalized, or name resources that cannot be URL
    path segments; ``errors`` says where."""

    status = 422
    code = "invalid_arguments"
    title = "Invalid arguments"


class IdempotencyKeyReused(ToolgateError):
    """The ``Idempotency-Key`` was already used for a different request (other tool,
    arguments or approval)."""

    status = 422
    code = "idempotency_key_reused"
    title = "Idempotency-Key reused"


class RunLimitExceeded(ToolgateError):
    """The call would take its run past one of the run's limits; the run ends."""

    status = 429
    code = "run_limit_exceeded"
    title = "Run limit exceeded"


class RepeatedCall(ToolgateError):
    """The run has repeated the same call too often; the run now needs clarification."""

    status = 429
    code = "repeated_call"
    title = "Repeated call"


# --- 502, 503, 504: the systems toolgate depends on ------------------------------------------


class ProviderUnavailable(ToolgateError):
    """The provider was not reached, answered with a body over its limit, or an owner
    lookup failed; for a mutation, only when the provider cannot have acted."""

    status = 502
    code = "provider_unavailable"
    title = "Provider unavailable"


class Unavailable(ToolgateError):
    """A dependency toolgate needs to decide is down (database, lock service, the token
    issuer's keys): the request fails closed, never as an allow."""

    status = 503
    code = "unavailable"
    title = "Service unavailable"


class ProviderTimeout(ToolgateError):
    """The provider may have acted but its outcome is unknown (a timeout, or toolgate's own
    failure after sending); the answer carries the operation id for reconciliation."""

    status = 504
    code = "provider_timeout"
    title = "Provider outcome unknown"


# Policy denials that are recorded as decisions (SPEC §4 /propose).
DENIALS: dict[str, type[ToolgateError]] = {
    cls.code: cls for cls in (ToolForbidden, IdentitySpoof, UnknownTool, InvalidArguments)
}
