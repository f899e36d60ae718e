"""A hand-minimal forwarder: the unavoidable I/O of one toolgate /execute, and nothing else.

It is the yardstick toolgate is measured against (``bench/run.py``). Same endpoint and body
shape as toolgate's ``POST /execute`` (``{"tool", "arguments"}``, ``Idempotency-Key``
header for mutations), so one wrk script drives both.

Per read (``get_order``): verify the HS256 JWT, GET the owner lookup from the provider,
forward the GET, write one audit row.

Per mutation (``create_ticket``): verify the JWT, GET the owner lookup, claim an idempotency
row (``INSERT ... ON CONFLICT DO NOTHING``), take a Redis lock (``SET NX PX``), forward the
POST with ``Idempotency-Key: <operation id>``, then ONE transaction writing the result and an
audit row, release the lock.

Plain Starlette, uvicorn (uvloop + httptools, 1 worker, no access log), asyncpg, redis-py,
aiohttp, orjson. Configuration from the environment::

    FWD_DATABASE_URL  FWD_REDIS_URL  FWD_REDIS_PREFIX  FWD_JWT_SECRET  FWD_PROVIDERS_URL

Run: ``python bench/minimal_forwarder.py --port 8181``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import jwt
import orjson
import redis.asyncio as redis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# The two demo tools the benchmark drives, as the catalog describes them.
TOOLS: dict[str, dict[str, Any]] = {
    "get_order": {
        "mutation": False,
        "method": "GET",
        "path": "/billing/orders/{order_id}",
        "owner": ("order_id", "/billing/orders/{}/owner"),
        "roles": {"support", "customer"},
        "fields": ("id", "status", "eta", "amount"),
    },
    "create_ticket": {
        "mutation": True,
        "method": "POST",
        "path": "/support/tickets",
        "owner": ("order_id", "/billing/orders/{}/owner"),
        "roles": {"support", "customer"},
        "fields": ("id", "status", "subject", "order_id"),
    },
}
_KEY = re.compile(r'"?([A-Za-z0-9_-]{16,255})"?')
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
LOCK_TTL_MS = 10_000
TIMEOUT = aiohttp.ClientTimeout(total=5, connect=5)

SCHEMA = """
CREATE TABLE IF NOT EXISTS fwd_executions (
    operation_id    text PRIMARY KEY,
    tenant          text NOT NULL,
    actor           text NOT NULL,
    idempotency_key text NOT NULL,
    call_id         text NOT NULL,
    state           text NOT NULL,
    provider_status integer,
    response        jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, actor, idempotency_key)
);
CREATE TABLE IF NOT EXISTS fwd_audit (
    seq        bigserial PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    event      text NOT NULL,
    call_id    text NOT NULL,
    tenant     text NOT NULL,
    actor      text NOT NULL,
    tool       text NOT NULL,
    arguments  jsonb,
    outcome    jsonb,
    total_ms   double precision
);
"""
_CLAIM = """
INSERT INTO fwd_executions (operation_id, tenant, actor, idempotency_key, call_id, state)
VALUES ($1, $2, $3, $4, $5, 'in_flight') ON CONFLICT DO NOTHING
"""
_FINISH = """
UPDATE fwd_executions SET state = $2, provider_status = $3, response = $4
WHERE operation_id = $1 AND state = 'in_flight'
"""
_AUDIT = """
INSERT INTO fwd_audit (event, call_id, tenant, actor, tool, arguments, outcome, total_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class Problem(Exception):
    def __init__(self, status: int, code: str) -> None:
        self.status, self.code = status, code


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


class Forwarder:
    def __init__(self) -> None:
        self.secret = os.environ["FWD_JWT_SECRET"]
        self.providers = os.environ["FWD_PROVIDERS_URL"].rstrip("/")
        self.prefix = os.environ.get("FWD_REDIS_PREFIX", "fwd:")
        self.db_url = os.environ["FWD_DATABASE_URL"]
        self.redis_url = os.environ["FWD_REDIS_URL"]

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async def init(conn: asyncpg.Connection) -> None:
            await conn.set_type_codec(
                "jsonb",
                encoder=lambda v: orjson.dumps(v).decode(),
                decoder=orjson.loads,
                schema="pg_catalog",
            )

        self.pool = await asyncpg.create_pool(self.db_url, min_size=2, max_size=20, init=init)
        async with self.pool.acquire() as conn:
            await conn.execute(SCHEMA)
        self.redis = redis.Redis.from_url(self.redis_url)
        self.release = self.redis.register_script(_RELEASE)
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        try:
            yield
        finally:
            await self.http.close()
            await self.redis.aclose()
            await self.pool.close()

    # -- the steps ------------------------------------------------------------------------

    def principal(self, request: Request) -> tuple[str, str, list[str]]:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            raise Problem(401, "unauthenticated")
        try:
            claims = jwt.decode(
                token, self.secret, algorithms=["HS256"], options={"require": ["sub", "exp", "tid"]}
            )
        except jwt.PyJWTError:
            raise Problem(401, "unauthenticated") from None
        return claims["sub"], claims["tid"], claims.get("roles", [])

    async def owner_ok(self, tool: dict[str, Any], args: dict[str, Any], tenant: str) -> None:
        arg, path = tool["owner"]
        if arg not in args:
            return
        url = self.providers + path.format(quote(str(args[arg]), safe=""))
        try:
            async with self.http.get(url, timeout=TIMEOUT, allow_redirects=False) as response:
                body = orjson.loads(await response.read())
                status = response.status
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            raise Problem(502, "provider_unavailable") from None
        if status != 200 or body.get("tenant") != tenant:
            raise Problem(403, "tool_forbidden")

    async def forward(
        self, tool: dict[str, Any], args: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, Any]:
        used = set(_PLACEHOLDER.findall(tool["path"]))
        path = tool["path"].format(**{k: quote(str(args[k]), safe="") for k in used})
        rest = {k: v for k, v in args.items() if k not in used}
        if tool["method"] == "GET":
            kwargs: dict[str, Any] = {"params": {k: str(v) for k, v in rest.items()} or None}
        else:
            kwargs = {"data": orjson.dumps(rest)}
            headers = {**headers, "Content-Type": "application/json"}
        async with self.http.request(
            tool["method"],
            self.providers + path,
            headers=headers,
            timeout=TIMEOUT,
            allow_redirects=False,
            **kwargs,
        ) as response:
            raw = await response.read()
            return response.status, orjson.loads(raw) if raw else None

    # -- the endpoint ---------------------------------------------------------------------

    async def execute(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            sub, tenant, roles = self.principal(request)
            try:
                body = orjson.loads(await request.body())
                tool_name, args = body["tool"], body["arguments"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise Problem(400, "invalid_request") from None
            tool = TOOLS.get(tool_name)
            if tool is None:
                raise Problem(404, "unknown_tool")
            if not isinstance(args, dict):
                raise Problem(422, "invalid_arguments")
            if not tool["roles"].intersection(roles):
                raise Problem(403, "tool_forbidden")
            if tool["mutation"]:
                return await self.mutation(request, tool_name, tool, args, sub, tenant, started)
            return await self.read(tool_name, tool, args, sub, tenant, started)
        except Problem as problem:
            return _json(
                {"code": problem.code, "status": problem.status},
                problem.status,
                {"Content-Type": "application/problem+json"},
            )

    async def read(
        self,
        name: str,
        tool: dict[str, Any],
        args: dict[str, Any],
        sub: str,
        tenant: str,
        started: float,
    ) -> Response:
        await self.owner_ok(tool, args, tenant)
        call_id = "call_" + secrets.token_hex(12)
        headers = {
            "X-Toolgate-Actor": sub,
            "X-Toolgate-Tenant": tenant,
            "X-Toolgate-Call-Id": call_id,
        }
        try:
            status, result = await self.forward(tool, args, headers)
        except (aiohttp.ClientError, TimeoutError):
            raise Problem(502, "provider_unavailable") from None
        outcome = "succeeded" if status < 300 else "failed"
        await self.pool.execute(
            _AUDIT,
            "executed" if outcome == "succeeded" else "failed",
            call_id,
            tenant,
            sub,
            name,
            args,
            {"status": outcome, "provider_status": status},
            (time.perf_counter() - started) * 1000,
        )
        return _json(self.answer(tool, call_id, None, outcome, status, result))

    async def mutation(
        self,
        request: Request,
        name: str,
        tool: dict[str, Any],
        args: dict[str, Any],
        sub: str,
        tenant: str,
        started: float,
    ) -> Response:
        match = _KEY.fullmatch(request.headers.get("idempotency-key", "").strip())
        if match is None:
            raise Problem(400, "idempotency_key_invalid")
        key = match.group(1)
        await self.owner_ok(tool, args, tenant)
        call_id = "call_" + secrets.token_hex(12)
        operation_id = "op_" + secrets.token_hex(12)
        claimed = await self.pool.execute(_CLAIM, operation_id, tenant, sub, key, call_id)
        if not claimed.endswith(" 1"):
            row = await self.pool.fetchrow(
                "SELECT state, response FROM fwd_executions"
                " WHERE tenant = $1 AND actor = $2 AND idempotency_key = $3",
                tenant,
                sub,
                key,
            )
            if row is not None and row["response"] is not None:
                replay = {**row["response"], "replayed": True}
                return _json(replay, headers={"Idempotent-Replayed": "true"})
            raise Problem(409, "idempotency_in_flight")
        lock, token = f"{self.prefix}lock:{tenant}:{sub}:{key}", secrets.token_hex(8)
        if not await self.redis.set(lock, token, nx=True, px=LOCK_TTL_MS):
            raise Problem(409, "idempotency_in_flight")
        try:
            headers = {
                "Idempotency-Key": operation_id,
                "X-Toolgate-Actor": sub,
                "X-Toolgate-Tenant": tenant,
                "X-Toolgate-Call-Id": call_id,
            }
            try:
                status, result = await self.forward(tool, args, headers)
            except aiohttp.ClientConnectorError:
                await self.pool.execute(
                    "DELETE FROM fwd_executions WHERE operation_id = $1", operation_id
                )
                raise Problem(502, "provider_unavailable") from None
            except (aiohttp.ClientError, TimeoutError):
                await self.pool.execute(_FINISH, operation_id, "unknown", None, None)
                raise Problem(504, "provider_timeout") from None
            outcome = "succeeded" if status < 300 else "failed"
            answer = self.answer(tool, call_id, operation_id, outcome, status, result)
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(_FINISH, operation_id, outcome, status, answer)
                await conn.execute(
                    _AUDIT,
                    "executed" if outcome == "succeeded" else "failed",
                    call_id,
                    tenant,
                    sub,
                    name,
                    args,
                    {"status": outcome, "provider_status": status, "operation_id": operation_id},
                    (time.perf_counter() - started) * 1000,
                )
        finally:
            await self.release(keys=[lock], args=[token])
        return _json(answer)

    @staticmethod
    def answer(
        tool: dict[str, Any],
        call_id: str,
        operation_id: str | None,
        status: str,
        provider_status: int,
        result: Any,
    ) -> dict[str, Any]:
        if isinstance(result, dict):
            result = {k: result[k] for k in tool["fields"] if k in result}
        return {
            "call_id": call_id,
            "operation_id": operation_id,
            "status": status,
            "provider_status": provider_status,
            "result": result,
            "trust": "untrusted",
            "replayed": False,
        }


async def healthz(request: Request) -> Response:
    return _json({"status": "ok"})


def create_app() -> Starlette:
    forwarder = Forwarder()
    return Starlette(
        routes=[
            Route("/execute", forwarder.execute, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        lifespan=forwarder.lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8181)
    ns = parser.parse_args()
    uvicorn.run(
        create_app(),
        host=ns.host,
        port=ns.port,
        workers=1,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
