"""Long polls under load: many waiters on one call, and other tenants' reads beside them.

    python bench/waits.py [--waiters 2000] [--wait 20] [--readers 4] [--previews 1]

Starts the demo providers and ``toolgate serve --workers 1`` on a throwaway database (as
``run.py`` does), puts one refund in front of its approvers (previewed ``--previews``
times: each adds to what a read of its history costs), and sends ``--waiters``
concurrent ``GET /calls/{id}?wait=S`` for it from one user. Meanwhile ``--readers``
clients of another tenant read an order, one request after another, for as long as the
waiters wait. Reports when each waiter was answered, past the time it asked for, and the
other tenant's latency; the figures go to the ledger. Figures only: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import jwt
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    HOST,
    BenchError,
    Processes,
    append_ledger,
    free_port,
    sigterm_as_interrupt,
    table,
    wait_ready,
)
from run import (
    add_common_arguments,
    create_database,
    delete_redis_keys,
    drop_database,
    migrate_and_start_providers,
    server_argv,
    throwaway,
)

REFUND = {"order_id": "ord_1", "amount": 150, "customer_id": "alice"}


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=2000, help="concurrent long polls")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds each waiter asks")
    parser.add_argument("--readers", type=int, default=4, help="other tenant's clients")
    parser.add_argument("--previews", type=int, default=1, help="dry-runs of the refund")
    add_common_arguments(parser)
    return parser.parse_args()


def bearer(secret: str, sub: str, tenant: str, roles: list[str]) -> str:
    now = int(time.time())
    claims = {"sub": sub, "tid": tenant, "roles": roles, "iat": now, "exp": now + 7200}
    return "Bearer " + jwt.encode(claims, secret, algorithm="HS256")


async def pending_refund(http: aiohttp.ClientSession, url: str, alice: str, previews: int) -> str:
    """A refund proposed and previewed ``previews`` times: it waits for its approvers."""
    headers = {"Authorization": alice}
    body = {"tool": "issue_refund", "arguments": REFUND}
    async with http.post(f"{url}/propose", json=body, headers=headers) as answer:
        call_id = str((await answer.json())["call_id"])
    for _ in range(max(previews, 1)):
        body = {"call_id": call_id}
        async with http.post(f"{url}/dry-run", json=body, headers=headers) as dry:
            if dry.status != 200:
                raise BenchError(f"dry-run answered {dry.status}: {await dry.text()}")
    return call_id


async def waiter(http: aiohttp.ClientSession, url: str, alice: str, wait: float) -> float:
    started = time.monotonic()
    async with http.get(url, params={"wait": str(wait)}, headers={"Authorization": alice}) as got:
        await got.read()
        if got.status != 200:
            raise BenchError(f"a waiter was answered {got.status}")
    return time.monotonic() - started


async def reader(
    http: aiohttp.ClientSession, url: str, carol: str, until: float, took: list[float]
) -> None:
    body = orjson.dumps({"tool": "get_order", "arguments": {"order_id": "ord_9"}})
    headers = {"Authorization": carol, "Content-Type": "application/json"}
    while time.monotonic() < until:
        started = time.monotonic()
        async with http.post(f"{url}/execute", data=body, headers=headers) as answer:
            await answer.read()
            if answer.status != 200:
                raise BenchError(f"the other tenant's read was answered {answer.status}")
        took.append(time.monotonic() - started)


async def measure(ns: argparse.Namespace, url: str, secret: str) -> dict[str, float]:
    alice = bearer(secret, "alice", "acme", ["support"])
    carol = bearer(secret, "carol", "globex", ["support"])
    connector = aiohttp.TCPConnector(limit=ns.waiters + ns.readers + 4)
    timeout = aiohttp.ClientTimeout(total=ns.wait + 120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        call_id = await pending_refund(http, url, alice, ns.previews)
        others: list[float] = []
        until = time.monotonic() + ns.wait
        readers = [reader(http, url, carol, until, others) for _ in range(ns.readers)]
        waiters = [
            waiter(http, f"{url}/calls/{call_id}", alice, ns.wait) for _ in range(ns.waiters)
        ]
        waiting = asyncio.gather(*waiters)
        await asyncio.gather(waiting, *readers)
    late = sorted(took - ns.wait for took in waiting.result())
    quantiles = statistics.quantiles(late, n=100) if len(late) > 1 else late * 99
    others_q = statistics.quantiles(others, n=100) if len(others) > 1 else others * 99
    return {
        "waiters": ns.waiters,
        "wait_s": ns.wait,
        "previews": ns.previews,
        "late_p50_s": round(statistics.median(late), 3),
        "late_p99_s": round(quantiles[98], 3),
        "late_max_s": round(late[-1], 3),
        "early": sum(1 for x in late if x < 0),
        "others_requests": len(others),
        "others_p50_ms": round(1000 * statistics.median(others), 2),
        "others_p99_ms": round(1000 * others_q[98], 2),
    }


def main() -> int:
    ns = _args()
    run = throwaway(ns.postgres, ns.redis)
    log_dir = Path(tempfile.mkdtemp(prefix=f"toolgate-{run.db_name}-"))
    with sigterm_as_interrupt():
        create_database(ns.postgres, run.db_name)
        try:
            with Processes(log_dir) as procs:
                migrate_and_start_providers(procs, run.env, run.provider_port)
                port = free_port()
                server = procs.start("toolgate", server_argv("toolgate", port), run.env)
                url = f"http://{HOST}:{port}"
                wait_ready(server, url + "/readyz", timeout_s=60)
                figures = asyncio.run(measure(ns, url, run.secret))
        finally:
            drop_database(ns.postgres, run.db_name)
            delete_redis_keys(ns.redis, run.prefixes)
    print(table(list(figures), [[str(v) for v in figures.values()]]))
    append_ledger(ns.ledger, "waits.py", figures)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
