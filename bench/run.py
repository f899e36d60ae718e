"""toolgate vs a hand-minimal forwarder: throughput, latency and memory under wrk.

One command, everything on 127.0.0.1, everything it starts it stops (also on Ctrl-C or
failure), and the throwaway database it creates it drops::

    python bench/run.py [--duration 15] [--concurrency 16]

Steps: create a database ``bench_<random>``; ``toolgate migrate`` it; start the demo
providers, ``toolgate serve --workers 1`` and ``bench/minimal_forwarder.py`` on free ports;
wait for readiness; smoke-test each target once; then, per workload and target, a short
warm-up followed by a measured wrk run:

* ``read``     -- ``get_order`` on ``ord_1`` as alice/acme/support;
* ``mutation`` -- ``create_ticket`` (low impact, no dry-run or approval) with a fresh
  ``Idempotency-Key`` per request; ``order_id: ord_1`` is passed so that both targets do the
  owner lookup too.

Prints req/s, p50, p99, non-2xx responses and the peak RSS of each server's process tree,
then the toolgate/forwarder ratios. Figures only -- this is not a test and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    HOST,
    LEDGER,
    ROOT,
    BenchError,
    Proc,
    Processes,
    RssSampler,
    WrkResult,
    append_ledger,
    comm_cpu_s,
    free_port,
    host_cpu_s,
    http,
    lua_script,
    require_wrk,
    run_wrk,
    sigterm_as_interrupt,
    table,
    tree_cpu_s,
    venv_bin,
    wait_ready,
)

WORKLOADS = {
    "read": {"tool": "get_order", "arguments": {"order_id": "ord_1"}},
    "mutation": {
        "tool": "create_ticket",
        "arguments": {
            "subject": "bench ticket",
            "body": "opened by bench/run.py",
            "order_id": "ord_1",
        },
    },
}
MCP_VERSION = "2026-07-28"
"""The MCP revision the bench speaks (per-request capabilities, no handshake)."""


@dataclass(frozen=True)
class Door:
    """The same work through another of toolgate's front doors (toolgate only: the
    forwarder has none), compared with ``base`` over REST on the same instance."""

    path: str
    body: dict[str, Any]
    base: str
    headers: dict[str, str]
    in_runs: bool = False


def _mcp_call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": "__N__",  # each request a new JSON-RPC request (a mutation runs once per id)
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MCP_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }


def _mcp_headers(tool: str) -> dict[str, str]:
    return {
        "MCP-Protocol-Version": MCP_VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
        "Accept": "application/json, text/event-stream",
    }


DOORS = {
    "run read": Door(
        "/execute", {**WORKLOADS["read"], "run_id": "__RUN__"}, "read", {}, in_runs=True
    ),
    "mcp read": Door(
        "/mcp",
        _mcp_call("get_order", WORKLOADS["read"]["arguments"]),  # type: ignore[arg-type]
        "read",
        _mcp_headers("get_order"),
    ),
    "mcp mutation": Door(
        "/mcp",
        _mcp_call("create_ticket", WORKLOADS["mutation"]["arguments"]),  # type: ignore[arg-type]
        "mutation",
        _mcp_headers("create_ticket"),
    ),
}
RUNS_PER_SCRIPT = 400
"""Runs made for each wrk script of ``run read``, which sends its requests round-robin over
them: a run admits 200 calls, so a script's warm-up or measured run may send up to 76,000
(more would be answered 429, counted as non-2xx)."""
CORES = os.cpu_count() or 1


@dataclass
class Row:
    round_no: int
    target: str
    workload: str
    result: WrkResult
    rss_mb: float
    cpu_pct: float
    provider_cpu_pct: float
    postgres_cpu_pct: float
    host_busy_pct: float


def add_common_arguments(
    parser: argparse.ArgumentParser, known: Collection[str] = tuple(WORKLOADS)
) -> None:
    """The servers to use, the workloads to run (of ``known``) and the ledger to record in,
    as ``run.py`` and ``instructions.py`` take them."""
    parser.add_argument(
        "--ledger",
        default=str(LEDGER),
        help="append the run's figures to this JSON-lines ledger ('' for none)",
    )
    parser.add_argument(
        "--postgres", default="postgresql://postgres@127.0.0.1:5432", help="server URL, no db"
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--workloads",
        type=lambda text: _workloads(text, known),
        default="read,mutation",
        help=f"comma-separated subset of {','.join(known)}",
    )


def _workloads(text: str, known: Collection[str]) -> list[str]:
    workloads = [w for w in text.split(",") if w]
    unknown = set(workloads) - set(known)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workloads: {sorted(unknown)}")
    return workloads


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per measured run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of warm-up per run")
    parser.add_argument("--concurrency", type=int, default=16, help="wrk connections")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (2 cores here)")
    add_common_arguments(parser, (*WORKLOADS, *DOORS))
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat the runs; the table shows medians"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the log directory")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="after each run, run the target again under `py-spy record --gil` (250 Hz) and "
        "write collapsed stacks to DIR, printing where the GIL-holding time goes",
    )
    return parser.parse_args()


# --- the throwaway database and redis keys -----------------------------------------------


async def _admin(server: str, sql: str) -> None:
    conn = await asyncpg.connect(server + "/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def create_database(server: str, name: str) -> None:
    asyncio.run(_admin(server, f'CREATE DATABASE "{name}"'))


def drop_database(server: str, name: str) -> None:
    asyncio.run(_admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def delete_redis_keys(url: str, prefixes: list[str]) -> int:
    client = redis.Redis.from_url(url)
    deleted = 0
    try:
        for prefix in prefixes:
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            if keys:
                deleted += int(client.delete(*keys))
    finally:
        client.close()
    return deleted


# --- the run -----------------------------------------------------------------------------


def token(secret: str) -> str:
    now = int(time.time())
    claims = {"sub": "alice", "tid": "acme", "roles": ["support"], "iat": now, "exp": now + 7200}
    return jwt.encode(claims, secret, algorithm="HS256")


@dataclass(frozen=True)
class Throwaway:
    """What one run makes and removes: a database, a Redis key prefix per target, a JWT
    secret, and a port for the demo providers; ``env`` is both targets' settings."""

    db_name: str
    prefixes: list[str]
    secret: str
    provider_port: int
    env: dict[str, str]


def throwaway(postgres: str, redis_url: str) -> Throwaway:
    nonce = secrets.token_hex(4)
    db_url = f"{postgres}/bench_{nonce}"
    prefixes = [f"bench-{nonce}:", f"bench-fwd-{nonce}:"]
    secret = secrets.token_hex(32)
    provider_port = free_port()
    providers_url = f"http://{HOST}:{provider_port}"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOOLGATE_DATABASE_URL": db_url,
        "TOOLGATE_REDIS_URL": redis_url,
        "TOOLGATE_REDIS_PREFIX": prefixes[0],
        "TOOLGATE_JWT_SECRET": secret,
        "TOOLGATE_CATALOG": "catalog/",
        "DEMO_PROVIDERS_URL": providers_url,
        "FWD_DATABASE_URL": db_url,
        "FWD_REDIS_URL": redis_url,
        "FWD_REDIS_PREFIX": prefixes[1],
        "FWD_JWT_SECRET": secret,
        "FWD_PROVIDERS_URL": providers_url,
    }
    return Throwaway(f"bench_{nonce}", prefixes, secret, provider_port, env)


def migrate_and_start_providers(procs: Processes, env: dict[str, str], port: int) -> Proc:
    """``toolgate migrate`` the bench database, then start the demo providers on ``port``
    and wait until they answer."""
    migrate = procs.start("migrate", [venv_bin("toolgate"), "migrate"], env)
    if migrate.popen.wait(timeout=60) != 0:
        raise BenchError(f"toolgate migrate failed:\n{migrate.tail()}")
    procs.stop(migrate)
    return start_providers(procs, env, port)


def smoke(base_url: str, bearer: str, workload: str, label: str) -> None:
    """One request by hand, so a broken target fails loudly before wrk hides it in counts."""
    path, headers, body = request_of(workload, bearer)
    if workload == "mutation":
        headers["Idempotency-Key"] = "smoke-" + secrets.token_hex(12)
    body = body.replace(b"__N__", secrets.token_hex(6).encode())
    if workload in DOORS and DOORS[workload].in_runs:
        body = body.replace(b"__RUN__", make_runs(base_url, bearer, 1)[0].encode())
    status, answer = http("POST", base_url + path, body, headers, timeout_s=10)
    if status != 200:
        raise BenchError(f"{label} {workload} smoke request answered {status}: {answer[:500]!r}")
    told = orjson.loads(answer)
    told = told["result"]["structuredContent"] if path == "/mcp" else told
    if told.get("status") != "succeeded":
        raise BenchError(f"{label} {workload} smoke request did not succeed: {told}")


def request_of(workload: str, bearer: str) -> tuple[str, dict[str, str], bytes]:
    """The path, headers and body of ``workload``'s requests."""
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
    if workload in WORKLOADS:
        return "/execute", headers, orjson.dumps(WORKLOADS[workload])
    door = DOORS[workload]
    return door.path, headers | door.headers, orjson.dumps(door.body)


def make_runs(base_url: str, bearer: str, count: int) -> list[str]:
    """``count`` new runs of the bench's user, for calls counted in runs."""
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
    made = []
    for _ in range(count):
        status, body = http("POST", base_url + "/runs", b'{"task": "bench"}', headers)
        if status != 200:
            raise BenchError(f"POST /runs answered {status}: {body[:300]!r}")
        made.append(str(orjson.loads(body)["run_id"]))
    return made


def main() -> int:
    ns = _args()
    require_wrk()
    workloads: list[str] = ns.workloads
    run = throwaway(ns.postgres, ns.redis)
    db_name, redis_prefixes, env = run.db_name, run.prefixes, run.env
    log_dir = Path(tempfile.mkdtemp(prefix=f"toolgate-{db_name}-"))
    rows: list[Row] = []
    database_created = False
    failed = True
    interrupted = False
    with sigterm_as_interrupt():
        try:
            create_database(ns.postgres, db_name)
            database_created = True
            with Processes(log_dir) as procs:
                providers = migrate_and_start_providers(procs, env, run.provider_port)
                targets = ["toolgate", "forwarder"]
                bearer = token(run.secret)
                servers: dict[str, Proc] = {}
                urls: dict[str, str] = {}

                for target in targets:  # started, ready and smoke-tested once per workload
                    port = free_port()
                    servers[target] = procs.start(target, server_argv(target, port), env)
                    urls[target] = f"http://{HOST}:{port}"
                    health = "/healthz" if target == "forwarder" else "/readyz"
                    wait_ready(servers[target], urls[target] + health, timeout_s=60)
                    for workload in workloads:
                        if target == "toolgate" or workload not in DOORS:
                            smoke(urls[target], bearer, workload, target)
                print(
                    f"toolgate pid {servers['toolgate'].pid}, forwarder pid "
                    f"{servers['forwarder'].pid}, providers pid {providers.pid}; db {db_name}; "
                    f"{ns.duration:.0f}s per run, {ns.concurrency} connections, "
                    f"{ns.threads} wrk thread(s); logs in {log_dir}",
                    flush=True,
                )
                with RssSampler({t: servers[t].pid for t in servers}) as sampler:
                    for round_no, target, target_workloads in schedule(
                        ns.rounds, workloads, targets
                    ):
                        for workload in target_workloads:
                            rows.append(
                                measure(
                                    ns,
                                    procs,
                                    sampler,
                                    urls[target],
                                    bearer,
                                    target,
                                    workload,
                                    servers[target].pid,
                                    providers.pid,
                                    f"http://{HOST}:{run.provider_port}",
                                    round_no,
                                )
                            )
                            for name, proc in [*servers.items(), ("providers", providers)]:
                                if not proc.alive():
                                    raise BenchError(f"{name} died:\n{proc.tail()}")
            failed = False
        except KeyboardInterrupt:
            print("\ninterrupted; cleaning up", file=sys.stderr)
            interrupted = True
        except BenchError as exc:
            print(f"bench failed: {exc}", file=sys.stderr)
        finally:
            if database_created:
                drop_database(ns.postgres, db_name)
            delete_redis_keys(ns.redis, redis_prefixes)
            if ns.keep_logs or (failed and not interrupted):
                print(f"logs kept in {log_dir}", file=sys.stderr)
            else:
                shutil.rmtree(log_dir, ignore_errors=True)
    if rows:
        report(rows)
        record(ns.ledger, ns, rows)
    return 1 if failed else 0


# The demo providers keep every request they serve in memory, for tests to read back. Under
# load that record grows by hundreds of thousands of objects, and the cyclic collector's full
# passes over it grew to 100 ms and more: pauses in a stand-in for outside systems that
# landed in whichever target was being measured. Their garbage is acyclic (freed as it goes),
# so they run here without the cyclic collector, and each run starts from their seed state.
PROVIDERS = (
    "import gc, runpy; gc.disable(); "
    "runpy.run_module('examples.demo_providers', run_name='__main__', alter_sys=True)"
)


def start_providers(procs: Processes, env: dict[str, str], port: int) -> Proc:
    """The demo providers on ``port``, once they answer."""
    argv = [sys.executable, "-c", PROVIDERS, "--host", HOST, "--port", str(port)]
    providers = procs.start("providers", argv, env)
    wait_ready(providers, f"http://{HOST}:{port}/billing/orders/ord_1/owner")
    return providers


def server_argv(target: str, port: int) -> list[str]:
    common = ["--host", HOST, "--port", str(port)]
    if target == "toolgate":
        return [venv_bin("toolgate"), "serve", *common, "--workers", "1"]
    return [sys.executable, str(ROOT / "bench" / "minimal_forwarder.py"), *common]


def schedule(
    rounds: int, workloads: list[str], targets: list[str]
) -> list[tuple[int, str, list[str]]]:
    """Round by round and workload by workload, every target back to back (so the runs a
    ratio compares are minutes apart at most); the target order alternates."""
    runs: list[tuple[int, str, list[str]]] = []
    for round_no in range(1, rounds + 1):
        order = targets if round_no % 2 else targets[::-1]
        for workload in workloads:
            here = ["toolgate"] if workload in DOORS else order  # the forwarder has no door
            runs.extend((round_no, target, [workload]) for target in here)
    return runs


def measure(
    ns: argparse.Namespace,
    procs: Processes,
    sampler: RssSampler,
    base_url: str,
    bearer: str,
    target: str,
    workload: str,
    server_pid: int,
    providers_pid: int,
    providers_url: str,
    round_no: int,
) -> Row:
    path, headers, body = request_of(workload, bearer)

    def script() -> str:
        """A wrk script; each call gets its own key prefix (and runs), so no run replays
        another's keys or fills another's runs."""
        in_runs = workload in DOORS and DOORS[workload].in_runs
        return lua_script(
            "POST",
            path,
            headers,
            body,
            fresh_idempotency_keys=workload == "mutation",
            key_prefix=f"bench-{re.sub(r'[^A-Za-z0-9]+', '_', target)}-"
            f"{re.sub(r'[^A-Za-z0-9]+', '_', workload)}-{secrets.token_hex(6)}",
            runs=make_runs(base_url, bearer, RUNS_PER_SCRIPT) if in_runs else (),
            threads=ns.threads,
        )

    common = {"concurrency": ns.concurrency, "threads": ns.threads}
    status, _ = http("POST", providers_url + "/_control/reset")
    if status != 200:
        raise BenchError(f"the providers answered {status} to a reset")
    if ns.warmup > 0:
        run_wrk(
            procs,
            base_url + path,
            script(),
            duration_s=ns.warmup,
            label=f"{target}-{workload}-warmup",
            **common,
        )
    sampler.reset()
    cpu0, pcpu0, t0 = tree_cpu_s(server_pid), tree_cpu_s(providers_pid), time.monotonic()
    pg0, (busy0, all0) = comm_cpu_s("postgres"), host_cpu_s()
    result = run_wrk(
        procs,
        base_url + path,
        script(),
        duration_s=ns.duration,
        label=f"{target}-{workload}-{round_no}",
        **common,
    )
    elapsed = time.monotonic() - t0
    busy1, all1 = host_cpu_s()
    row = Row(
        round_no,
        target,
        workload,
        result,
        sampler.peak_mb(target),
        100 * (tree_cpu_s(server_pid) - cpu0) / elapsed,
        100 * (tree_cpu_s(providers_pid) - pcpu0) / elapsed,
        100 * (comm_cpu_s("postgres") - pg0) / elapsed,
        100 * CORES * (busy1 - busy0) / max(all1 - all0, 1e-9),
    )
    print(
        f"  {target:9} {workload:8} {result.rps:8.0f} req/s  p50 {result.p50_ms:6.1f} ms  "
        f"p99 {result.p99_ms:6.1f} ms  non-2xx {result.non2xx}  rss {row.rss_mb:.0f} MB  "
        f"cpu {row.cpu_pct:.0f}% (providers {row.provider_cpu_pct:.0f}%, postgres "
        f"{row.postgres_cpu_pct:.0f}%, host {row.host_busy_pct:.0f}% of {100 * CORES}%)",
        flush=True,
    )
    if result.sample:
        print(f"    first non-2xx: {result.sample}", flush=True)
    if ns.profile and round_no == 1:
        profile(ns, procs, base_url + path, script(), server_pid, target, workload, common)
    return row


def profile(
    ns: argparse.Namespace,
    procs: Processes,
    url: str,
    script: str,
    pid: int,
    target: str,
    workload: str,
    common: dict[str, int],
) -> None:
    """Drive the target once more while py-spy samples its worker; print the hottest frames."""
    out = Path(ns.profile)
    out.mkdir(parents=True, exist_ok=True)
    seconds = max(3, round(ns.duration))
    spy = procs.start(
        f"py-spy-{workload}",
        [
            venv_bin("py-spy"),
            "record",
            "-p",
            str(pid),
            "-d",
            str(seconds),
            "-r",
            str(PROFILE_HZ),
            "--gil",
            "--nolineno",
            "-f",
            "raw",
            "-o",
            str(out / f"{target}-{workload}.txt"),
        ],
        os.environ,
    )
    run_wrk(
        procs,
        url,
        script,
        duration_s=seconds,
        label=f"{target}-{workload}-profile",
        **common,
    )
    try:
        spy.popen.wait(timeout=30)
    finally:
        procs.stop(spy)
    summarize_profile(out / f"{target}-{workload}.txt", seconds * PROFILE_HZ, workload)


PROFILE_HZ = 250
# Leaf-first attribution: a sample counts for the first (deepest) frame whose file matches.
CATEGORIES = [
    ("opentelemetry/", "OpenTelemetry (spans, propagation)"),
    ("fastapi/telemetry/", "OpenTelemetry (spans, propagation)"),
    ("asyncpg/", "asyncpg (PostgreSQL round trips)"),
    ("aiohttp/", "aiohttp client (provider calls)"),
    ("redis/", "redis-py (lock)"),
    ("jwt/", "PyJWT (token verification)"),
    ("logging/", "logging (access log + JSON log lines, incl. writer thread)"),
    ("uvicorn/logging", "logging (access log + JSON log lines, incl. writer thread)"),
    ("(json/", "stdlib json (asyncpg jsonb codec)"),
    ("(app/", "toolgate app code (policy, schema, fingerprint, rows)"),
    ("rfc8785/", "toolgate app code (policy, schema, fingerprint, rows)"),
    ("(copy.py", "toolgate app code (policy, schema, fingerprint, rows)"),
    ("(dataclasses.py", "toolgate app code (policy, schema, fingerprint, rows)"),
    ("pydantic", "FastAPI/Starlette routing, DI, pydantic"),
    ("fastapi/", "FastAPI/Starlette routing, DI, pydantic"),
    ("starlette/", "FastAPI/Starlette routing, DI, pydantic"),
    ("uvicorn/", "uvicorn HTTP server"),
]


def summarize_profile(path: Path, possible: int, workload: str) -> None:
    """Where the worker's busy samples go: by library (leaf-first) and by app function."""
    if not path.exists():
        print(f"    (no profile written: {path})")
        return
    buckets: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if f]
        bucket = "other (event loop, asyncio, misc)"
        for frame in reversed(frames):
            match = next((name for marker, name in CATEGORIES if marker in frame), None)
            if match is not None:
                bucket = match
                break
        buckets[bucket] = buckets.get(bucket, 0) + count
        for frame in set(frames):
            if "(app/" in frame or frame.startswith("Connection.reset"):
                inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        print("    (empty profile)")
        return
    print(
        f"    py-spy --gil {workload}: {total} samples holding the GIL of ~{possible} possible "
        f"(~{100 * total / possible:.0f}% of the time); share of those samples:"
    )
    for name, count in sorted(buckets.items(), key=lambda kv: -kv[1]):
        print(f"      {100 * count / total:5.1f}%  {name}")
    print("    inclusive, toolgate functions:")
    skip = ("main (app/cli.py)", "_serve (app/cli.py)")
    ranked = [(f, c) for f, c in sorted(inclusive.items(), key=lambda kv: -kv[1]) if f not in skip]
    for frame, count in ranked[:16]:
        print(f"      {100 * count / total:5.1f}%  {frame}")
    print(f"    collapsed stacks: {path} (flamegraph.pl / speedscope can render them)")


@dataclass(frozen=True)
class Summary:
    target: str
    workload: str
    rounds: int
    rps: float
    p50_ms: float
    p99_ms: float
    non2xx: int
    socket_errors: int
    rss_mb: float
    cpu_pct: float
    provider_cpu_pct: float
    postgres_cpu_pct: float
    host_busy_pct: float


def summarize(rows: list[Row]) -> list[Summary]:
    """Medians over rounds (req/s, latencies, CPU); sums of errors; the highest RSS."""
    out = []
    targets = list(dict.fromkeys(r.target for r in rows))
    for workload in (*WORKLOADS, *DOORS):
        for target in targets:
            mine = [r for r in rows if (r.target, r.workload) == (target, workload)]
            if not mine:
                continue
            out.append(
                Summary(
                    target,
                    workload,
                    len(mine),
                    statistics.median(r.result.rps for r in mine),
                    statistics.median(r.result.p50_ms for r in mine),
                    statistics.median(r.result.p99_ms for r in mine),
                    sum(r.result.non2xx for r in mine),
                    sum(r.result.socket_errors for r in mine),
                    max(r.rss_mb for r in mine),
                    statistics.median(r.cpu_pct for r in mine),
                    statistics.median(r.provider_cpu_pct for r in mine),
                    statistics.median(r.postgres_cpu_pct for r in mine),
                    statistics.median(r.host_busy_pct for r in mine),
                )
            )
    return out


def paired(rows: list[Row], target: str, workload: str) -> list[tuple[float, float]]:
    """Per round: (req/s ratio, p99 ratio) of ``target`` to the forwarder in that round;
    for a front door other than REST, of toolgate's door to toolgate's REST ``base``."""
    by = {(r.round_no, r.target, r.workload): r for r in rows}
    against = ("toolgate", DOORS[workload].base) if workload in DOORS else ("forwarder", workload)
    pairs = []
    for r in rows:
        other = by.get((r.round_no, *against))
        if (r.target, r.workload) == (target, workload) and other and other.result.rps:
            pairs.append((r.result.rps / other.result.rps, r.result.p99_ms / other.result.p99_ms))
    return pairs


def record(ledger: str, ns: argparse.Namespace, rows: list[Row]) -> None:
    """This run's medians and each round's ratios, in the ledger (``append_ledger``)."""
    figures: dict[str, Any] = {}
    for s in summarize(rows):
        entry = figures.setdefault(s.workload, {})
        entry[f"{s.target}_rps"] = round(s.rps, 1)
        entry[f"{s.target}_p99_ms"] = round(s.p99_ms, 2)
        pairs = paired(rows, s.target, s.workload) if s.target != "forwarder" else []
        if pairs:
            entry["ratio"] = round(statistics.median(p[0] for p in pairs), 3)
            entry["p99_ratio"] = round(statistics.median(p[1] for p in pairs), 3)
            entry["rounds"] = [[round(t, 3), round(q, 3)] for t, q in pairs]
    append_ledger(
        ledger,
        "run.py",
        figures,
        duration_s=ns.duration,
        rounds=ns.rounds,
        concurrency=ns.concurrency,
    )


def report(rows: list[Row]) -> None:
    summaries = summarize(rows)
    rounds = max(s.rounds for s in summaries)
    print()
    if rounds > 1:
        print(f"medians of {rounds} rounds (non-2xx and socket errors summed, RSS is the peak)")
    print(
        table(
            [
                "target",
                "workload",
                "req/s",
                "p50 ms",
                "p99 ms",
                "non-2xx",
                "sock err",
                "peak RSS MB",
                "server CPU %",
                "server CPU ms/req",
                "providers CPU %",
                "postgres CPU %",
                "host CPU %",
            ],
            [
                [
                    s.target,
                    s.workload,
                    f"{s.rps:.0f}",
                    f"{s.p50_ms:.1f}",
                    f"{s.p99_ms:.1f}",
                    s.non2xx,
                    s.socket_errors,
                    f"{s.rss_mb:.0f}",
                    f"{s.cpu_pct:.0f}",
                    f"{10 * s.cpu_pct / s.rps:.2f}" if s.rps else "-",
                    f"{s.provider_cpu_pct:.0f}",
                    f"{s.postgres_cpu_pct:.0f}",
                    f"{s.host_busy_pct:.0f}",
                ]
                for s in summaries
            ],
        )
    )
    ratio_rows = []
    for s in summaries:
        pairs = paired(rows, s.target, s.workload) if s.target != "forwarder" else []
        if not pairs:
            continue
        throughput, p99 = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        ratio_rows.append(
            [
                s.target,
                s.workload,
                f"{throughput:.2f}x",
                f"{p99:.2f}x",
                " ".join(f"{t:.2f}/{q:.2f}" for t, q in pairs),
            ]
        )
    if ratio_rows:
        print()
        print(
            "ratios measured in the same round, the median of the rounds: REST to the "
            "forwarder; the other front doors to toolgate's REST of the same work"
        )
        print(
            table(
                ["target", "workload", "req/s ratio", "p99 ratio", "each round"],
                ratio_rows,
            )
        )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
