"""What the provenance check costs /propose: without a run, with a run that remembers
nothing, and with runs that each remember about 10,000 values.

One command, everything on 127.0.0.1, everything it starts it stops, and the throwaway
database it creates it drops::

    python bench/provenance.py [--duration 10] [--rounds 3] [--concurrency 8]
                               [--endorsement [--full-trusted]]

Steps: create a database ``bench_<random>``; ``toolgate migrate`` it; start the demo
providers and ``toolgate serve --workers 1`` with the demo catalog plus
``examples/bank.yaml``; prepare runs (a run admits at most 200 calls, so proposals rotate
over several runs, each well below that); then, round by round, each scenario for
``--duration`` seconds with ``--concurrency`` clients proposing the same low-impact transfer:

* ``no run``          -- ``send_money`` without ``run_id``: no provenance work at all;
* ``empty run``       -- with the ``run_id`` of a run that has read nothing;
* ``10,000 values``   -- with the ``run_id`` of a run that has read 5,000 generated
  transactions (10,000 distinct strings, about 30,000 windows), and the recipient is not
  among them: every window of the argument is looked up.

With ``--endorsement`` it measures what endorsement costs instead: two reads of the saved
payees that differ only in five ``x-endorsed`` string arguments (``pay_plain`` and
``pay_endorsed``, added to the catalog), each proposed and executed in runs that have read
5,000 transactions (10,000 values remembered) and the saved payees (a trusted result),
while the tenant holds 10,000 known values of the arguments' kind. Of the five values one
is in the run's task, one in the trusted result and three are known values, so every source
is looked up and every argument is endorsed (the calls are allowed, as the plain ones are):

* ``propose plain`` / ``propose endorsed``;
* ``execute plain`` / ``execute endorsed`` (a read: no key, the provider is called).

``--full-trusted`` makes it the worst case a run allows: before the payees, each run reads a
trusted ledger of about 250,000 characters (``read_ledger``: the transactions, trusted, so
the run keeps nearly all the trusted text it may), and the value endorsed by a trusted result
is the ledger's last counterparty; the three known values are judged after the task.

Prints req/s, p50, p99 and the server's CPU milliseconds per request for each scenario
(medians over the rounds; the scenario order alternates between rounds), and with
``--endorsement`` the endorsed/plain ratios. Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    HOST,
    ROOT,
    BenchError,
    Processes,
    free_port,
    sigterm_as_interrupt,
    table,
    tree_cpu_s,
    venv_bin,
    wait_ready,
)
from run import (
    create_database,
    delete_redis_keys,
    drop_database,
    migrate_and_start_providers,
    token,
)

from app.known.digests import digest

TRANSFER = {"account_id": "acc_1", "recipient": "NL91 ABNA 0417 1643 00", "amount": 1.0}
TASK = "Pay the rent to Landlord GmbH."
KNOWN_VALUES = 10_000
ENDORSED_ARGS = {  # one from the task, one from the trusted payees, three known values
    "a": "Landlord GmbH",
    "b": "NL91 ABNA 0417 1643 00",
    "c": "known-payee-00017",
    "d": "known-payee-04242",
    "e": "known-payee-09999",
}
PAY_TOOL = """
  {name}:
    description: Read the saved payees, naming five parties (a cost benchmark).
    mutation: false
    provider: bank
    execute: {{method: GET, path: "/accounts/{{account_id}}/payees"}}
    access: {{roles: [support], owner: tenant}}
    parameters:
      type: object
      additionalProperties: false
      required: [account_id, a, b, c, d, e]
      properties:
        account_id: {{type: string, x-resource: account}}
{properties}"""
LEDGER_ROWS = 3_900
"""Generated transactions in the trusted ledger: about 63 characters of words each, so the
ledger's words come to just under ``MAX_TRUSTED_CHARS`` with the payees."""
LEDGER_TOOL = """
  read_ledger:
    description: The account's transactions, as a ledger its owner alone writes (a benchmark).
    mutation: false
    provider: bank
    execute: {method: GET, path: "/accounts/{account_id}/transactions"}
    access: {roles: [support], owner: tenant}
    parameters:
      type: object
      additionalProperties: false
      required: [account_id, extra]
      properties:
        account_id: {type: string, x-resource: account}
        extra: {type: integer, minimum: 0, maximum: 10000}
    result: {trusted: true}
"""
CALLS_PER_RUN = 190
"""Proposals sent under one run before the next one is used (the server caps a run at 200)."""


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--endorsement", action="store_true", help="measure what endorsement costs instead"
    )
    parser.add_argument(
        "--full-trusted",
        action="store_true",
        help="with --endorsement: runs also hold a trusted ledger of about 250,000 characters",
    )
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    return parser.parse_args()


async def new_run(
    client: httpx.AsyncClient, values: bool, trusted: bool = False, ledger: bool = False
) -> str:
    response = await client.post("/runs", json={"task": TASK})
    run_id = str(response.json()["run_id"])
    reads = [("list_transactions", {"account_id": "acc_1", "extra": 5000})] if values else []
    if ledger:
        reads.append(("read_ledger", {"account_id": "acc_1", "extra": LEDGER_ROWS}))
    if trusted:
        reads.append(("list_payees", {"account_id": "acc_1"}))
    for tool, arguments in reads:
        body = {"tool": tool, "arguments": arguments, "run_id": run_id}
        read = await client.post("/execute", json=body, timeout=60)
        if read.status_code != 200:
            raise BenchError(f"the read {tool} failed: {read.text[:300]}")
    return run_id


def proposing_a_transfer(response: httpx.Response) -> bool:
    return response.status_code == 200 and not response.json()["taint"]


async def measure(
    client: httpx.AsyncClient,
    runs: list[str] | None,
    duration: float,
    concurrency: int,
    server_pid: int,
    request: tuple[str, dict[str, object]] = (
        "/propose",
        {"tool": "send_money", "arguments": TRANSFER},
    ),
    fine: Callable[[httpx.Response], bool] = proposing_a_transfer,
) -> tuple[float, float, float, float]:
    """(req/s, p50 ms, p99 ms, server CPU ms per request) of ``request`` (a path and body)
    without a run (``runs`` is ``None``) or spread over ``runs``, each taking at most
    ``CALLS_PER_RUN`` (the window ends early when they are used up); an answer that is not
    ``fine`` stops the bench."""
    path, template = request
    latencies: list[float] = []
    deadline = time.perf_counter() + duration
    numbers = count()

    async def worker() -> None:
        while time.perf_counter() < deadline:
            body = dict(template)
            if runs is not None:
                n = next(numbers) // CALLS_PER_RUN
                if n >= len(runs):
                    return
                body["run_id"] = runs[n]
            started = time.perf_counter()
            response = await client.post(path, json=body)
            latencies.append((time.perf_counter() - started) * 1000)
            if not fine(response):
                raise BenchError(f"{path} answered {response.status_code}: {response.text[:300]}")

    began, cpu = time.perf_counter(), tree_cpu_s(server_pid)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - began, tree_cpu_s(server_pid) - cpu
    latencies.sort()
    return (
        len(latencies) / elapsed,
        latencies[len(latencies) // 2],
        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        cpu * 1000 / len(latencies),
    )


async def scenarios(
    url: str, bearer: str, ns: argparse.Namespace, server_pid: int
) -> list[list[str]]:
    headers = {"Authorization": f"Bearer {bearer}"}
    limits = httpx.Limits(max_connections=ns.concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as c:
        # enough runs for the fastest scenario's proposals in one measured window
        needed = 2 + int(ns.duration * 400 / CALLS_PER_RUN)
        results: dict[str, list[tuple[float, float, float, float]]] = {}
        for round_no in range(ns.rounds):
            print(f"round {round_no + 1}: preparing {needed} runs of each kind", flush=True)
            prepared: dict[str, list[str] | None] = {
                "no run": None,
                "empty run": [await new_run(c, False) for _ in range(needed)],
                "10,000 values": [await new_run(c, True) for _ in range(needed)],
            }
            order = list(prepared) if round_no % 2 == 0 else list(reversed(prepared))
            for name in order:
                runs = prepared[name]
                warm_up, measured = (runs[-1:], runs[:-1]) if runs else (None, None)
                await measure(c, warm_up, 2.0, ns.concurrency, server_pid)
                figures = await measure(c, measured, ns.duration, ns.concurrency, server_pid)
                results.setdefault(name, []).append(figures)
                print(
                    f"  {name}: {figures[0]:.0f} req/s, p50 {figures[1]:.2f} ms, "
                    f"p99 {figures[2]:.2f} ms",
                    flush=True,
                )
    return [
        [
            name,
            f"{statistics.median(r[0] for r in rows):.0f}",
            f"{statistics.median(r[1] for r in rows):.2f}",
            f"{statistics.median(r[2] for r in rows):.2f}",
            f"{statistics.median(r[3] for r in rows):.2f}",
        ]
        for name, rows in results.items()
    ]


def endorsed_catalog(directory: Path) -> None:
    """``pay_plain`` and ``pay_endorsed``: the same read, the second with its five string
    arguments ``x-endorsed`` (of one kind)."""
    plain = "".join(f"        {name}: {{type: string}}\n" for name in ENDORSED_ARGS)
    endorsed = "".join(
        f"        {name}: {{type: string, x-endorsed: true, x-endorsed-kind: payee}}\n"
        for name in ENDORSED_ARGS
    )
    tools = (
        PAY_TOOL.format(name="pay_plain", properties=plain)
        + PAY_TOOL.format(name="pay_endorsed", properties=endorsed)
        + LEDGER_TOOL
    )
    with (directory / "bank.yaml").open("a") as bank:
        bank.write(tools)


async def remember_known_values(database_url: str, key: str) -> None:
    """``KNOWN_VALUES`` known payees of acme, as an admin's PUTs would store them (digested
    under the server's ``key``)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = [
            ("acme", "payee", digest(key.encode(), "payee", value), value, "bench")
            for value in (f"known-payee-{n:05d}" for n in range(KNOWN_VALUES))
        ]
        await conn.copy_records_to_table(
            "known_values", records=rows, columns=["tenant", "kind", "digest", "value", "added_by"]
        )
    finally:
        await conn.close()


def pay_is_endorsed(response: httpx.Response) -> bool:
    """Allowed, and for the endorsed tool every argument endorsed by its intended source."""
    if response.status_code != 200:
        return False
    sources = {e["argument"]: e["source"] for e in response.json().get("endorsement") or []}
    return sources in (
        {},
        {"a": "task", "b": "trusted_result", "c": "known", "d": "known", "e": "known"},
    )


async def endorsement_scenarios(
    url: str, bearer: str, ns: argparse.Namespace, server_pid: int
) -> list[list[str]]:
    headers = {"Authorization": f"Bearer {bearer}"}
    limits = httpx.Limits(max_connections=ns.concurrency)
    arguments = {"account_id": "acc_1", **ENDORSED_ARGS}
    if ns.full_trusted:  # endorsed only by the ledger's last row: the ledger was kept, and searched
        arguments["b"] = f"Shop {LEDGER_ROWS - 1:05d}"
    requests: dict[str, tuple[str, dict[str, object]]] = {
        f"{path.strip('/')} {kind}": (path, {"tool": f"pay_{kind}", "arguments": arguments})
        for path in ("/propose", "/execute")
        for kind in ("plain", "endorsed")
    }
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as c:
        needed = 2 + int(ns.duration * 400 / CALLS_PER_RUN)
        results: dict[str, list[tuple[float, float, float, float]]] = {}
        for round_no in range(ns.rounds):
            print(f"round {round_no + 1}: preparing {needed} runs per scenario", flush=True)
            order = list(requests) if round_no % 2 == 0 else list(reversed(requests))
            for name in order:
                runs = [
                    await new_run(c, True, trusted=True, ledger=ns.full_trusted)
                    for _ in range(needed)
                ]
                request = requests[name]
                await measure(
                    c, runs[-1:], 2.0, ns.concurrency, server_pid, request, pay_is_endorsed
                )
                figures = await measure(
                    c, runs[:-1], ns.duration, ns.concurrency, server_pid, request, pay_is_endorsed
                )
                results.setdefault(name, []).append(figures)
                print(f"  {name}: {figures[0]:.0f} req/s, p50 {figures[1]:.2f} ms", flush=True)
    medians = {
        name: [statistics.median(r[i] for r in rows) for i in range(4)]
        for name, rows in results.items()
    }
    table_rows = [
        [name, f"{m[0]:.0f}", f"{m[1]:.2f}", f"{m[2]:.2f}", f"{m[3]:.2f}"]
        for name, m in medians.items()
    ]
    for path in ("propose", "execute"):
        plain, endorsed = medians[f"{path} plain"], medians[f"{path} endorsed"]
        table_rows.append(
            [
                f"{path} endorsed/plain",
                f"{endorsed[0] / plain[0]:.2f}x",
                f"{endorsed[1] / plain[1]:.2f}x",
                f"{endorsed[2] / plain[2]:.2f}x",
                f"{endorsed[3] / plain[3]:.2f}x",
            ]
        )
    return table_rows


def main() -> int:
    ns = _args()
    nonce = secrets.token_hex(4)
    db_name = f"bench_{nonce}"
    secret = secrets.token_hex(32)
    prefix = f"bench-{nonce}:"
    log_dir = Path(tempfile.mkdtemp(prefix=f"toolgate-bench-{nonce}-"))
    catalog = log_dir / "catalog"
    catalog.mkdir()
    shutil.copy(ROOT / "catalog" / "demo.yaml", catalog)
    shutil.copy(ROOT / "examples" / "bank.yaml", catalog)
    if ns.endorsement:
        endorsed_catalog(catalog)
    provider_port, port = free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOOLGATE_DATABASE_URL": f"{ns.postgres}/{db_name}",
        "TOOLGATE_REDIS_URL": ns.redis,
        "TOOLGATE_REDIS_PREFIX": prefix,
        "TOOLGATE_JWT_SECRET": secret,
        "TOOLGATE_KNOWN_VALUES_KEY": secrets.token_hex(32),
        "TOOLGATE_CATALOG": str(catalog),
        "DEMO_PROVIDERS_URL": f"http://{HOST}:{provider_port}",
    }
    rows: list[list[str]] = []
    created = False
    with sigterm_as_interrupt():
        try:
            create_database(ns.postgres, db_name)
            created = True
            with Processes(log_dir) as procs:
                migrate_and_start_providers(procs, env, provider_port)
                serve = [venv_bin("toolgate"), "serve", "--host", HOST, "--port", str(port)]
                server = procs.start("toolgate", [*serve, "--workers", "1"], env)
                wait_ready(server, f"http://{HOST}:{port}/readyz", timeout_s=60)
                url = f"http://{HOST}:{port}"
                if ns.endorsement:
                    asyncio.run(
                        remember_known_values(
                            env["TOOLGATE_DATABASE_URL"], env["TOOLGATE_KNOWN_VALUES_KEY"]
                        )
                    )
                    measured = endorsement_scenarios(url, token(secret), ns, server.pid)
                else:
                    measured = scenarios(url, token(secret), ns, server.pid)
                rows = asyncio.run(measured)
        except KeyboardInterrupt:
            print("\ninterrupted; cleaning up", file=sys.stderr)
        except BenchError as exc:
            print(f"bench failed: {exc}\nlogs in {log_dir}", file=sys.stderr)
            return 1
        finally:
            if created:
                drop_database(ns.postgres, db_name)
            delete_redis_keys(ns.redis, [prefix])
    shutil.rmtree(log_dir, ignore_errors=True)
    if rows:
        print(table(["scenario", "req/s", "p50 ms", "p99 ms", "server CPU ms/req"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
