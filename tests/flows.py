"""The steps of a call as a client takes them, for tests that walk the whole path."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import httpx

Auth = Callable[..., dict[str, str]]
ALICE = {"sub": "alice", "roles": "support"}
BOB = {"sub": "bob", "roles": "finance_approver"}


def new_key() -> str:
    return "key-" + secrets.token_hex(12)


def refund_args(amount: float = 150.0, **extra: Any) -> dict[str, Any]:
    return {"order_id": "ord_1", "amount": amount, "customer_id": "alice", **extra}


class Flow:
    """A client session: propose, dry-run, approve and execute, asserting each step's status."""

    def __init__(self, client: httpx.AsyncClient, auth: Auth) -> None:
        self.client = client
        self.auth = auth

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        who: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        return await self.client.post(
            path, json=body, headers={**self.auth(**(who or ALICE)), **(headers or {})}
        )

    async def propose(
        self, tool: str, args: dict[str, Any], who: dict[str, str] | None = None
    ) -> dict[str, Any]:
        response = await self.post("/propose", {"tool": tool, "arguments": args}, who)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def dry_run(self, call_id: str, who: dict[str, str] | None = None) -> dict[str, Any]:
        response = await self.post("/dry-run", {"call_id": call_id}, who)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def approve(
        self,
        call_id: str,
        snapshot_hash: str | None,
        who: dict[str, str] | None = None,
        decision: str = "approve",
    ) -> httpx.Response:
        return await self.post(
            "/approve",
            {"call_id": call_id, "snapshot_hash": snapshot_hash, "decision": decision},
            who or BOB,
        )

    async def execute(
        self,
        tool: str,
        args: dict[str, Any],
        key: str | None,
        who: dict[str, str] | None = None,
        **extra: Any,
    ) -> httpx.Response:
        headers = {"Idempotency-Key": key} if key is not None else {}
        return await self.post("/execute", {"tool": tool, "arguments": args, **extra}, who, headers)

    async def approved_refund(self, amount: float = 150.0) -> tuple[dict[str, Any], str]:
        """A high-impact refund proposed, previewed and approved: (proposal, approval_id)."""
        proposal = await self.propose("issue_refund", refund_args(amount))
        preview = await self.dry_run(proposal["call_id"])
        approval = await self.approve(proposal["call_id"], preview["snapshot_hash"])
        assert approval.status_code == 200, approval.text
        return proposal, approval.json()["approval_id"]
