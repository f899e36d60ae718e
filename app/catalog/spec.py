"""The catalog file's shape, as pydantic models that forbid unknown keys.

These models describe only what the YAML may say; cross-references, JSON Schema and CEL
are checked in ``loader`` once the shape is right.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderSpec(_Spec):
    base_url: str = Field(min_length=1)
    timeout_s: float = Field(default=5.0, gt=0, le=300)
    headers: dict[str, str] = Field(default_factory=dict)
    max_response_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    """The longest answer read from this provider; a longer one is not read at all. The
    default is the outbound client's own cap; the catalog states it here rather than import
    the client, so that the catalog's models (and the policy that reads them) load no I/O."""


class EndpointSpec(_Spec):
    method: Method
    path: str = Field(pattern=r"^/")


class ResourceSpec(_Spec):
    provider: str
    owner: EndpointSpec


class ApprovalSpec(_Spec):
    approvers: list[str] = Field(min_length=1)
    ttl_s: int = Field(default=300, gt=0, le=86400)


class AccessSpec(_Spec):
    roles: list[str] | None = None
    owner: Literal["tenant", "user"] = "tenant"


class ResultSpec(_Spec):
    fields: list[str] | None = None
    redact: list[str] = Field(default_factory=list)


class ToolSpec(_Spec):
    description: str = ""
    mutation: bool
    provider: str
    execute: EndpointSpec | None = None
    dry_run: EndpointSpec | None = None
    reconcile: EndpointSpec | None = None
    require_dry_run: bool = False
    impact: Literal["low", "high"] | None = None
    high_impact_when: str | None = None
    approval: ApprovalSpec | None = None
    access: AccessSpec = Field(default_factory=AccessSpec)
    cost: float = Field(default=0.0, ge=0)
    parameters: dict[str, Any]
    result: ResultSpec = Field(default_factory=ResultSpec)


class CatalogSpec(_Spec):
    version: str = Field(min_length=1)
    providers: dict[str, ProviderSpec] = Field(default_factory=dict)
    resources: dict[str, ResourceSpec] = Field(default_factory=dict)
    tools: dict[str, ToolSpec] = Field(default_factory=dict)
