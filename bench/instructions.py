"""Instructions per request, toolgate against the forwarder: a yardstick host noise does not move.

    python bench/instructions.py [--requests 300] [--workloads read,mutation,run read,mcp read]

The same setup as ``run.py`` (a throwaway database, the demo providers, the same workloads,
everything stopped and dropped afterwards), but each target runs under
``valgrind --tool=callgrind`` with counting off. Over one kept-alive connection it serves
``--warmup`` requests, then counting is switched on (``callgrind_control -i on``) for
``--requests`` sequential requests, and the count is read from callgrind's dump. The same
tree counts within about 1 % from run to run, whatever else the host is doing, which
seconds on a shared host never do. Only the server process is counted: toolgate's sealer
runs outside valgrind. Figures only; it asserts nothing.

A front door of ``run.py`` (``run read``, ``mcp read``, ...) is counted for toolgate only,
beside the REST workload it is compared with there (counted too, if not asked for).
"""

from __future__ import annotations

import argparse
import http.client
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    HOST,
    BenchError,
    Processes,
    append_ledger,
    free_port,
    sigterm_as_interrupt,
    wait_ready,
)
from run import (
    DOORS,
    WORKLOADS,
    add_common_arguments,
    create_database,
    delete_redis_keys,
    drop_database,
    make_runs,
    migrate_and_start_providers,
    request_of,
    server_argv,
    throwaway,
    token,
)


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests counted")
    parser.add_argument("--warmup", type=int, default=100, help="requests before counting")
    add_common_arguments(parser, (*WORKLOADS, *DOORS))
    return parser.parse_args()


def send(
    connection: http.client.HTTPConnection,
    bearer: str,
    workload: str,
    n: int,
    runs: list[str],
) -> None:
    """``n`` requests of ``workload``, each answered 200, as ``run.py`` sends them: each a
    new JSON-RPC id, a REST mutation a new key, a call in a run spread over ``runs``."""
    path, headers, body = request_of(workload, bearer)
    for i in range(n):
        sent = body.replace(b"__N__", secrets.token_hex(6).encode())
        if runs:
            sent = sent.replace(b"__RUN__", runs[i % len(runs)].encode())
        if workload == "mutation":
            headers = headers | {"Idempotency-Key": "instr-" + secrets.token_hex(12)}
        connection.request("POST", path, sent, headers)
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise BenchError(f"{workload} answered {response.status}: {answer[:300]!r}")


def callgrind_control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def counted(out: Path) -> int:
    """Instructions in every dump callgrind wrote for ``out`` (counting was on in one)."""
    return sum(
        int(match)
        for path in out.parent.glob(out.name + "*")
        for match in re.findall(r"^totals: (\d+)", path.read_text(), re.MULTILINE)
    )


def main() -> int:
    ns = _args()
    if shutil.which("callgrind_control") is None:
        raise BenchError("valgrind is not installed (apt-get install -y valgrind)")
    run = throwaway(ns.postgres, ns.redis)
    work = Path(tempfile.mkdtemp(prefix=f"toolgate-instructions-{run.db_name}-"))
    bearer = token(run.secret)
    workloads: list[str] = []
    for asked in ns.workloads:  # a door beside the REST workload it is compared with
        for workload in (DOORS[asked].base, asked) if asked in DOORS else (asked,):
            if workload not in workloads:
                workloads.append(workload)
    per_request: dict[tuple[str, str], int] = {}
    with sigterm_as_interrupt():
        create_database(ns.postgres, run.db_name)
        try:
            with Processes(work) as procs:
                migrate_and_start_providers(procs, run.env, run.provider_port)
                for workload in workloads:
                    door = DOORS.get(workload)
                    for target in ("toolgate",) if door else ("toolgate", "forwarder"):
                        port = free_port()
                        out = work / f"{target}-{workload}.callgrind"
                        valgrind = [
                            "valgrind",
                            "--tool=callgrind",
                            "--instr-atstart=no",
                            "--trace-children=no",
                            f"--callgrind-out-file={out}",
                        ]
                        argv = [*valgrind, *server_argv(target, port)]
                        server = procs.start(f"{target}-{workload}", argv, run.env)
                        wait_ready(server, f"http://{HOST}:{port}/healthz", timeout_s=300)
                        connection = http.client.HTTPConnection(HOST, port, timeout=120)
                        runs = []
                        if door is not None and door.in_runs:  # a run admits 200 calls
                            count = (ns.warmup + ns.requests) // 150 + 1
                            runs = make_runs(f"http://{HOST}:{port}", bearer, count)
                        send(connection, bearer, workload, ns.warmup, runs)
                        callgrind_control("--instr=on", server.pid)
                        send(connection, bearer, workload, ns.requests, runs)
                        callgrind_control("--instr=off", server.pid)
                        callgrind_control("--dump", server.pid)
                        connection.close()
                        procs.stop(server)
                        per_request[target, workload] = counted(out) // ns.requests
                        print(f"{target:9} {workload:12} {per_request[target, workload]:>11,}")
        finally:
            drop_database(ns.postgres, run.db_name)
            delete_redis_keys(ns.redis, run.prefixes)
            shutil.rmtree(work, ignore_errors=True)
    print("\n| workload | toolgate | compared with | its count | it / toolgate |")
    print("|---|---:|---|---:|---:|")
    for workload in workloads:
        door = DOORS.get(workload)
        other = ("toolgate", door.base) if door else ("forwarder", workload)
        mine, theirs = per_request["toolgate", workload], per_request[other]
        print(
            f"| {workload} | {mine // 1000:,} k | {' '.join(other)} | {theirs // 1000:,} k"
            f" | {theirs / mine:.2f} |"
        )
    figures = {
        workload: {
            target: count // 1000
            for (target, done), count in per_request.items()
            if done == workload
        }
        for workload in workloads
    }
    append_ledger(
        ns.ledger,
        "instructions.py",
        figures,
        unit="thousand instructions per request, worker only",
        requests=ns.requests,
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
