"""One error hierarchy; each class carries its HTTP status and SPEC §5 ``code``.

Services raise these; ``app.main`` renders every one as RFC 9457 problem+json. ``detail``
must never reveal another tenant's data or whether another tenant's resource exists.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ToolgateError(Exception):
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


def _error(status: int, code: str, title: str) -> type[ToolgateError]:
    return type(
        "".join(part.title() for part in code.split("_")),
        (ToolgateError,),
        {"status": status, "code": code, "title": title, "__module__": __name__},
    )


InvalidRequest = _error(400, "invalid_request", "Invalid request")
ContentTooLarge = _error(413, "invalid_request", "Request body too large")
HeadersTooLarge = _error(431, "invalid_request", "Request header fields too large")
IdempotencyKeyMissing = _error(400, "idempotency_key_missing", "Idempotency-Key required")
IdempotencyKeyInvalid = _error(400, "idempotency_key_invalid", "Idempotency-Key malformed")
Unauthenticated = _error(401, "unauthenticated", "Authentication required")
ToolForbidden = _error(403, "tool_forbidden", "Tool call forbidden")
IdentitySpoof = _error(403, "identity_spoof", "Identity spoof")
ApprovalRequired = _error(403, "approval_required", "Approval required")
ApprovalExpired = _error(403, "approval_expired", "Approval expired")
ApprovalRejected = _error(403, "approval_rejected", "Approval rejected")
ApproverForbidden = _error(403, "approver_forbidden", "Approver forbidden")
DryRunRequired = _error(403, "dry_run_required", "Dry-run required")
# Not in SPEC §5: a role-gated read (the audit trail) the caller's roles do not allow.
Forbidden = _error(403, "forbidden", "Forbidden")
UnknownTool = _error(404, "unknown_tool", "Unknown tool")
NotFound = _error(404, "not_found", "Not found")
ApprovalMismatch = _error(409, "approval_mismatch", "Approval does not match")
ApprovalConsumed = _error(409, "approval_consumed", "Approval already used")
IdempotencyInFlight = _error(409, "idempotency_in_flight", "Request still in flight")
InvalidArguments = _error(422, "invalid_arguments", "Invalid arguments")
IdempotencyKeyReused = _error(422, "idempotency_key_reused", "Idempotency-Key reused")
RunLimitExceeded = _error(429, "run_limit_exceeded", "Run limit exceeded")
RepeatedCall = _error(429, "repeated_call", "Repeated call")
ProviderUnavailable = _error(502, "provider_unavailable", "Provider unavailable")
Unavailable = _error(503, "unavailable", "Service unavailable")
ProviderTimeout = _error(504, "provider_timeout", "Provider outcome unknown")

# Policy denials that are recorded as decisions (SPEC §4 /propose).
DENIALS: dict[str, type[ToolgateError]] = {
    cls.code: cls for cls in (ToolForbidden, IdentitySpoof, UnknownTool, InvalidArguments)
}
