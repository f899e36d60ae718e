"""Which HTTP client should toolgate use towards providers? httpx vs aiohttp, measured.

The same tiny FastAPI forwarder (``GET /fwd`` -> ``GET <provider>/billing/orders/ord_1``,
body passed through) runs once with ``httpx.AsyncClient()`` (default transport) and once
with ``aiohttp.ClientSession()``, each under uvicorn (uvloop + httptools, 1 worker, no
access log); wrk drives each at the same concurrency. Prints req/s and latency per client::

    python bench/provider_clients.py [--duration 10] [--concurrency 16] [--rounds 1]

The demo providers (``python -m examples.demo_providers``) are started and stopped here;
everything stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    HOST,
    BenchError,
    Processes,
    free_port,
    lua_script,
    require_wrk,
    run_wrk,
    sigterm_as_interrupt,
    table,
    tree_cpu_s,
    wait_ready,
)

CLIENTS = ("httpx", "aiohttp")


def create_app(client: str, upstream: str) -> Any:
    """The forwarder, with one client opened in the lifespan and reused for every request."""
    from fastapi import FastAPI, Response

    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if client == "httpx":
            import httpx

            state["client"] = httpx.AsyncClient(timeout=5.0)
            try:
                yield
            finally:
                await state["client"].aclose()
        else:
            import aiohttp

            state["client"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0))
            try:
                yield
            finally:
                await state["client"].close()

    app = FastAPI(lifespan=lifespan, openapi_url=None)

    if client == "httpx":

        @app.get("/fwd")
        async def fwd_httpx() -> Response:
            upstream_response = await state["client"].get(upstream)
            return Response(
                upstream_response.content,
                upstream_response.status_code,
                media_type="application/json",
            )

    else:

        @app.get("/fwd")
        async def fwd_aiohttp() -> Response:
            async with state["client"].get(upstream) as upstream_response:
                body = await upstream_response.read()
                return Response(body, upstream_response.status, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def serve(client: str, port: int, upstream: str) -> None:
    import uvicorn

    uvicorn.run(
        create_app(client, upstream),
        host=HOST,
        port=port,
        workers=1,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="repeat; the table shows medians")
    parser.add_argument("--serve", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    ns = _args()
    if ns.serve:  # child mode: one forwarder
        serve(ns.serve, ns.port, ns.upstream)
        return 0
    require_wrk()
    log_dir = Path(tempfile.mkdtemp(prefix="toolgate-bench-clients-"))
    provider_port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    results: dict[str, list[tuple[float, float, float, int, float]]] = {c: [] for c in CLIENTS}
    failed = True
    interrupted = False
    with sigterm_as_interrupt():
        try:
            with Processes(log_dir) as procs:
                providers = procs.start(
                    "providers",
                    [sys.executable, "-m", "examples.demo_providers", "--host", HOST,
                     "--port", str(provider_port)],
                    env,
                )  # fmt: skip
                upstream = f"http://{HOST}:{provider_port}/billing/orders/ord_1"
                wait_ready(providers, upstream)
                print(
                    f"{ns.duration:.0f}s per run, {ns.concurrency} connections, "
                    f"{ns.threads} wrk thread(s), {ns.rounds} round(s); upstream {upstream}",
                    flush=True,
                )
                script = lua_script("GET", "/fwd", {})
                for round_no in range(1, ns.rounds + 1):
                    order = CLIENTS if round_no % 2 else CLIENTS[::-1]
                    for client in order:
                        port = free_port()
                        server = procs.start(
                            f"fwd-{client}-{round_no}",
                            [sys.executable, __file__, "--serve", client, "--port", str(port),
                             "--upstream", upstream],
                            env,
                        )  # fmt: skip
                        url = f"http://{HOST}:{port}"
                        wait_ready(server, url + "/healthz")
                        common = {"concurrency": ns.concurrency, "threads": ns.threads}
                        if ns.warmup > 0:
                            run_wrk(procs, url + "/fwd", script, duration_s=ns.warmup,
                                    label=f"{client}-{round_no}-warmup", **common)  # fmt: skip
                        cpu0 = tree_cpu_s(server.pid)
                        result = run_wrk(procs, url + "/fwd", script, duration_s=ns.duration,
                                         label=f"{client}-{round_no}", **common)  # fmt: skip
                        cpu = 100 * (tree_cpu_s(server.pid) - cpu0) / result.seconds
                        procs.stop(server)
                        results[client].append(
                            (result.rps, result.p50_ms, result.p99_ms, result.non2xx, cpu)
                        )
                        print(
                            f"  {client:8} round {round_no}: {result.rps:7.0f} req/s  "
                            f"p50 {result.p50_ms:5.1f} ms  p99 {result.p99_ms:5.1f} ms  "
                            f"non-2xx {result.non2xx}  socket errors {result.socket_errors}  "
                            f"cpu {cpu:.0f}%",
                            flush=True,
                        )
            failed = False
        except KeyboardInterrupt:
            print("\ninterrupted; cleaning up", file=sys.stderr)
            interrupted = True
        except BenchError as exc:
            print(f"bench failed: {exc}", file=sys.stderr)
        finally:
            if failed and not interrupted:
                print(f"logs kept in {log_dir}", file=sys.stderr)
            else:
                shutil.rmtree(log_dir, ignore_errors=True)
    rows = []
    for client, runs in results.items():
        if runs:
            rows.append(
                [
                    client,
                    "GET provider",
                    f"{statistics.median(r[0] for r in runs):.0f}",
                    f"{statistics.median(r[1] for r in runs):.1f}",
                    f"{statistics.median(r[2] for r in runs):.1f}",
                    sum(r[3] for r in runs),
                    f"{statistics.median(r[4] for r in runs):.0f}",
                ]
            )
    if rows:
        print()
        print(table(["client", "workload", "req/s", "p50 ms", "p99 ms", "non-2xx", "CPU %"], rows))
        if all(results.values()):
            httpx_rps = statistics.median(r[0] for r in results["httpx"])
            aiohttp_rps = statistics.median(r[0] for r in results["aiohttp"])
            print(f"\naiohttp/httpx throughput: {aiohttp_rps / httpx_rps:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
