"""A small catalog for pure policy tests, independent of the demo catalog."""

from __future__ import annotations

from pathlib import Path

from app.catalog.loader import load
from app.catalog.models import Catalog

BASE = """
version: "t1"
providers:
  billing: {base_url: "http://127.0.0.1:9", timeout_s: 2}
resources:
  order:
    provider: billing
    owner: {method: GET, path: "/orders/{id}/owner"}
tools:
  get_order:
    mutation: false
    provider: billing
    execute: {method: GET, path: "/orders/{order_id}"}
    access: {roles: [support, customer]}
    parameters:
      type: object
      additionalProperties: false
      required: [order_id]
      properties:
        order_id: {type: string, pattern: "^ord_[A-Za-z0-9]+$", x-resource: order}
    result: {fields: [id, status]}
  issue_refund:
    mutation: true
    provider: billing
    execute: {method: POST, path: /refunds}
    dry_run: {method: POST, path: /refunds/preview}
    require_dry_run: true
    high_impact_when: "args.amount > 100.0"
    approval: {approvers: [actor, "role:finance_approver"], ttl_s: 300}
    access: {roles: [support], owner: tenant}
    parameters:
      type: object
      additionalProperties: false
      required: [order_id, amount, customer_id]
      properties:
        order_id: {type: string, x-resource: order}
        amount: {type: number, exclusiveMinimum: 0, maximum: 5000}
        customer_id: {type: string, x-identity: user}
        currency: {type: string, enum: [EUR, USD], default: EUR}
        notify_url: {type: string, format: uri, x-egress: public}
        note: {type: string, maxLength: 500, x-sensitive: true}
  update_email:
    mutation: true
    provider: billing
    execute: {method: PATCH, path: "/customers/{customer_id}"}
    impact: high
    approval: {approvers: ["role:support_lead"]}
    access: {owner: user}
    parameters:
      type: object
      additionalProperties: false
      required: [customer_id, email]
      properties:
        customer_id: {type: string, x-resource: order}
        email: {type: string}
        tenant_id: {type: string, x-identity: tenant}
"""


def write(tmp: Path, text: str, name: str = "catalog.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def small_catalog(tmp: Path) -> Catalog:
    return load(write(tmp, BASE), {})
