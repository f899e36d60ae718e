"""Does toolgate's cost stay flat as history grows? The ops queries and the hot path against a
database loaded by ``bench/history.py`` (or an empty one).

    python bench/history.py --calls 1000000            # once: database history_1000000
    python bench/scale.py --database history_1000000   # or --empty for the baseline

Starts the demo providers and ``toolgate serve --workers 1`` on the database, then:

1. **ops queries**: each ``GET /audit`` filter of the API (as an auditor of the big tenant
   and as an admin), deep pages, ``GET /approvals`` in each status (and a deep page) and two
   exports, each timed once cold and then ``--repeat`` times (p50, p90);
2. **the hot path**: ``bench/run.py``'s read and mutation workloads under wrk, the same
   warm-up and measured runs;
3. **heavy reads beside it**: per round, the read workload alone, then while one client
   keeps exporting the big tenant's whole trail and another keeps verifying the chain; the
   median over the rounds of p99 beside them against p99 alone.

Prints figures; asserts nothing. It stops what it starts; the database is left as found
(plus the rows the hot path wrote), an ``--empty`` one is dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import asyncpg
import jwt

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run
from _harness import (
    HOST,
    BenchError,
    Processes,
    RssSampler,
    free_port,
    http,
    require_wrk,
    sigterm_as_interrupt,
    table,
    venv_bin,
    wait_ready,
)

from app import cursors


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--database", help="a database loaded by bench/history.py")
    target.add_argument("--empty", action="store_true", help="a fresh, empty database")
    parser.add_argument("--repeat", type=int, default=15, help="timed runs per ops query")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of wrk warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="hot-path and heavy-read rounds")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip", default="", help="comma-separated: ops,hot,heavy")
    parser.add_argument(
        "--postgres", default="postgresql://postgres@127.0.0.1:5432", help="server URL, no db"
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ns = parser.parse_args()
    ns.profile = None  # run.measure's option
    return ns


def bearer(secret: str, sub: str, tenant: str, roles: list[str]) -> str:
    now = int(time.time())
    claims = {"sub": sub, "tid": tenant, "roles": roles, "iat": now, "exp": now + 7200}
    return jwt.encode(claims, secret, algorithm="HS256")


async def samples(url: str) -> dict[str, str]:
    """Values to filter by, taken from the middle of the loaded history."""
    conn = await asyncpg.connect(url)
    try:
        middle = await conn.fetchrow(
            "SELECT seq, at, call_id, run_id, actor FROM audit_events WHERE tenant = 'acme'"
            " AND run_id IS NOT NULL AND seq >= (SELECT max(seq) / 2 FROM audit_events)"
            " ORDER BY seq LIMIT 1"
        )
        small = await conn.fetchval(
            "SELECT tenant FROM audit_events WHERE tenant <> 'acme' LIMIT 1"
        )
    finally:
        await conn.close()
    if middle is None:
        at = datetime.now(UTC)
        return {
            "seq": "1",
            "since": _rfc3339(at - timedelta(days=1)),
            "until": _rfc3339(at),
            "call_id": "call_none",
            "run_id": "run_none",
            "actor": "alice",
            "small": "t1",
        }
    return {
        "seq": str(middle["seq"]),
        "since": _rfc3339(middle["at"]),
        "until": _rfc3339(middle["at"] + timedelta(days=1)),
        "call_id": middle["call_id"],
        "run_id": middle["run_id"],
        "actor": middle["actor"],
        "small": small or "t1",
    }


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ops_queries(s: dict[str, str]) -> list[tuple[str, str, str]]:
    """(who, label, path): every documented filter of GET /audit, alone and combined."""
    deep = cursors.encode(int(s["seq"]))
    inbox_deep = cursors.encode(s["since"].replace("Z", "+00:00"), s["call_id"])
    window = {"since": s["since"], "until": s["until"]}
    audit = "/audit?"
    return [
        ("auditor", "first page", "/audit"),
        ("auditor", "deep page (cursor mid-history)", audit + urlencode({"cursor": deep})),
        ("auditor", "event=expired (rare)", audit + "event=expired"),
        ("auditor", "event=denied", audit + "event=denied"),
        ("auditor", "event=executed", audit + "event=executed"),
        ("auditor", "actor=", audit + urlencode({"actor": s["actor"]})),
        ("auditor", "tool=deploy_service", audit + "tool=deploy_service"),
        ("auditor", "call_id=", audit + urlencode({"call_id": s["call_id"]})),
        ("auditor", "run_id=", audit + urlencode({"run_id": s["run_id"]})),
        ("auditor", "since+until (one day, mid-history)", audit + urlencode(window)),
        ("auditor", "since (mid-history)", audit + urlencode({"since": s["since"]})),
        (
            "auditor",
            "until (mid-history), deep",
            audit + urlencode({"until": s["until"], "cursor": deep}),
        ),
        ("auditor", "event=expired + one day", audit + urlencode({"event": "expired", **window})),
        (
            "auditor",
            "actor + event=executed",
            audit + urlencode({"actor": s["actor"], "event": "executed"}),
        ),
        ("auditor", "tool + one day", audit + urlencode({"tool": "issue_refund", **window})),
        ("auditor", "limit=1000 deep", audit + urlencode({"limit": 1000, "cursor": deep})),
        ("admin", "admin: every tenant", "/audit"),
        ("admin", "admin: event=expired", audit + "event=expired"),
        ("admin", "admin: small tenant", audit + urlencode({"tenant": s["small"]})),
        ("admin", "admin: one day", audit + urlencode(window)),
        ("approver", "approvals (no status: pending)", "/approvals"),
        *(
            ("approver", f"approvals status={status}", f"/approvals?status={status}")
            for status in ("pending", "approved", "rejected", "expired")
        ),
        (
            "approver",
            "approvals status=approved, deep",
            "/approvals?" + urlencode({"status": "approved", "cursor": inbox_deep}),
        ),
        ("auditor", "export event=expired", "/audit/export?event=expired"),
        ("auditor", "export one day", "/audit/export?" + urlencode(window)),
    ]


def time_ops(base: str, tokens: dict[str, str], s: dict[str, str], repeat: int) -> None:
    rows = []
    for who, label, path in ops_queries(s):
        headers = {"Authorization": f"Bearer {tokens[who]}"}
        times, size = [], 0
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            status, body = http("GET", base + path, headers=headers, timeout_s=60)
            times.append(1000 * (time.perf_counter() - t0))
            if status != 200:
                raise BenchError(f"{path} answered {status}: {body[:300]!r}")
            size = len(body)
        cold, warm = times[0], sorted(times[1:])
        rows.append(
            [
                label,
                f"{cold:.1f}",
                f"{statistics.median(warm):.1f}",
                f"{warm[int(0.9 * (len(warm) - 1))]:.1f}",
                f"{size / 1024:.0f}",
            ]
        )
    print(table(["query", "first ms", "p50 ms", "p90 ms", "KiB"], rows))


class HeavyReader:
    """Two clients beside the hot path: one keeps exporting the big tenant's trail, the other
    keeps verifying the chain. Leaving closes both connections, so that nothing they started
    runs on into the next measurement."""

    def __init__(self, base: str, auditor: str) -> None:
        self._where = urlsplit(base)
        self._auditor = auditor
        self._stop = threading.Event()
        self.started = {"/audit/export": 0, "/audit/verify": 0}
        self._open: dict[str, HTTPConnection] = {}
        self._threads = [
            threading.Thread(target=self._run, args=(path,), daemon=True) for path in self.started
        ]

    def __enter__(self) -> HeavyReader:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for conn in list(self._open.values()):
            with contextlib.suppress(OSError):
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=10)

    def _run(self, path: str) -> None:
        with contextlib.suppress(OSError, HTTPException, ValueError):
            while not self._stop.is_set():
                self.started[path] += 1
                self._read(path)

    def _read(self, path: str) -> None:
        """Read the answer as it streams, dropping it; give up once told to stop."""
        conn = self._open[path] = HTTPConnection(self._where.hostname or "", self._where.port)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {self._auditor}"})
            response = conn.getresponse()
            while response.read(1 << 16) and not self._stop.is_set():
                pass
        finally:
            conn.close()


def main() -> int:
    ns = _args()
    require_wrk()
    skip = {s for s in ns.skip.split(",") if s}
    nonce = secrets.token_hex(4)
    name = ns.database or f"scale_empty_{nonce}"
    url = f"{ns.postgres}/{name}"
    secret = secrets.token_hex(32)
    log_dir = Path(tempfile.mkdtemp(prefix=f"toolgate-scale-{nonce}-"))
    provider_port, port = free_port(), free_port()
    providers_url = f"http://{HOST}:{provider_port}"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOOLGATE_DATABASE_URL": url,
        "TOOLGATE_REDIS_URL": ns.redis,
        "TOOLGATE_REDIS_PREFIX": f"scale-{nonce}:",
        "TOOLGATE_JWT_SECRET": secret,
        "TOOLGATE_CATALOG": "catalog/",
        "DEMO_PROVIDERS_URL": providers_url,
    }
    failed = True
    with sigterm_as_interrupt():
        try:
            if ns.empty:
                run.create_database(ns.postgres, name)
            with Processes(log_dir) as procs:
                migrate = procs.start("migrate", [venv_bin("toolgate"), "migrate"], env)
                if migrate.popen.wait(timeout=600) != 0:
                    raise BenchError(f"toolgate migrate failed:\n{migrate.tail()}")
                providers = run.start_providers(procs, env, provider_port)
                server = procs.start("toolgate", run.server_argv("toolgate", port), env)
                base = f"http://{HOST}:{port}"
                wait_ready(server, base + "/readyz", timeout_s=120)
                tokens = {
                    "auditor": bearer(secret, "audrey", "acme", ["auditor"]),
                    "admin": bearer(secret, "root", "acme", ["admin"]),
                    "approver": bearer(
                        secret,
                        "lee",
                        "acme",
                        ["finance_approver", "support_lead", "release_manager"],
                    ),
                }
                agent = run.token(secret)
                for workload in run.WORKLOADS:
                    run.smoke(base + "/execute", agent, workload, "toolgate")
                print(f"database {name}; toolgate pid {server.pid}; logs in {log_dir}", flush=True)
                if "ops" not in skip:
                    print("ops queries (auditor and approver of the big tenant, admin):")
                    time_ops(base, tokens, asyncio.run(samples(url)), ns.repeat)
                with RssSampler({"toolgate": server.pid}) as sampler:

                    def measure(workload: str, round_no: int) -> run.Row:
                        return run.measure(
                            ns, procs, sampler, base, agent, "toolgate", workload,
                            server.pid, providers.pid, providers_url, round_no,
                        )  # fmt: skip

                    if "hot" not in skip:
                        print("hot path:")
                        run.report(
                            [
                                measure(workload, round_no)
                                for round_no in range(1, ns.rounds + 1)
                                for workload in run.WORKLOADS
                            ]
                        )
                    if "heavy" not in skip:
                        print("reads alone, then beside clients exporting and verifying:")
                        ratios = []
                        for _ in range(ns.rounds):
                            alone = measure("read", 0)
                            with HeavyReader(base, tokens["auditor"]) as heavy:
                                beside = measure("read", 0)
                            ratios.append(beside.result.p99_ms / alone.result.p99_ms)
                            print(
                                f"  p99 {alone.result.p99_ms:.1f} -> {beside.result.p99_ms:.1f} ms"
                                f" ({ratios[-1]:.2f}x), req/s {alone.result.rps:.0f} -> "
                                f"{beside.result.rps:.0f}; exports and verifies started: "
                                f"{heavy.started['/audit/export']}, "
                                f"{heavy.started['/audit/verify']}"
                            )
                        print(
                            f"  p99 beside heavy reads: {statistics.median(ratios):.2f}x "
                            f"the p99 alone (median of {len(ratios)} rounds)"
                        )
            failed = False
        except KeyboardInterrupt:
            print("\ninterrupted; cleaning up", file=sys.stderr)
        except BenchError as exc:
            print(f"bench failed: {exc}", file=sys.stderr)
        finally:
            if ns.empty:
                run.drop_database(ns.postgres, name)
            run.delete_redis_keys(ns.redis, [f"scale-{nonce}:"])
            if failed:
                print(f"logs kept in {log_dir}", file=sys.stderr)
            else:
                shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
