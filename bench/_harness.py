"""Shared plumbing for the bench scripts: child processes, readiness, wrk, RSS sampling.

Everything listens on 127.0.0.1. Every child is started in its own session so that it can
be stopped by its own process-group id (and nothing else) -- on success, on failure and on
Ctrl-C. Every wait loop has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


class BenchError(Exception):
    """Something the benchmark needs did not work; the message says what."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


LEDGER = Path(__file__).resolve().parent / "ledger.jsonl"
"""Where the benches append their dated runs, one JSON object a line."""


def append_ledger(ledger: str, bench: str, figures: dict[str, Any], **settings: Any) -> None:
    """Append one run to ``ledger`` (``LEDGER`` unless told otherwise; ``''``: none): a JSON
    object with the date, the commit measured, the settings and the figures, so dated runs
    are kept as data and ``README.md`` shows only the latest."""
    if not ledger:
        return
    line = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "bench": bench,
        "tree": git_tree(),
        **settings,
        "figures": figures,
    }
    with open(ledger, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
    print(f"recorded in {ledger}")


def git_tree() -> str:
    """The commit measured, with ``+dirty`` when the work tree differs from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (commit or "unknown") + ("+dirty" if dirty else "")


def venv_bin(name: str) -> str:
    """A console script next to the running interpreter (the venv), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise BenchError(f"{name!r} is not installed")
    return found


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so ``finally`` blocks clean up either way."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class Proc:
    """A child process in its own session, logging to a file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 8.0) -> None:
        """SIGTERM the process group, then SIGKILL it if it lingers."""
        if self.popen.poll() is not None:
            _reap_group(self.pid)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=grace_s)
        _reap_group(self.pid)


def _reap_group(pgid: int) -> None:
    """Children left in a finished leader's group (there should be none) get SIGKILL."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, 0)
        os.killpg(pgid, signal.SIGKILL)


class Processes:
    """Starts children and stops all of them, newest first, when the block exits."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[Proc] = []

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path = ROOT
    ) -> Proc:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self._procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self) -> None:
        while self._procs:
            proc = self._procs.pop()
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                print(f"warning: could not stop {proc.name} (pid {proc.pid}): {exc}")

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(proc: Proc, url: str, timeout_s: float = 30.0) -> None:
    """Poll ``url`` until it answers 200, the process dies, or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if not proc.alive():
            raise BenchError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            status, body = http("GET", url, timeout_s=2.0)
            if status == 200:
                return
            last = f"{status} {body[:200]!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise BenchError(
        f"{proc.name} not ready at {url} after {timeout_s:.0f}s ({last}):\n{proc.tail()}"
    )


# --- memory ------------------------------------------------------------------------------


def _status_kb(pid: int, field_name: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    for _ in range(1000):  # bounded walk
        if not todo:
            break
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo.extend(int(c) for c in children.read().split())
        except (OSError, ValueError):
            continue
    return found


def largest_rss_kb(pid: int) -> int:
    """VmRSS of the biggest process in the tree: a worker's (toolgate serve's leader, with
    one worker), not its sealer's."""
    return max(_status_kb(p, "VmRSS") for p in _descendants(pid))


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds consumed so far by the process tree (live members only)."""
    ticks = 0
    for member in _descendants(pid):
        try:
            with open(f"/proc/{member}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def host_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / tick, sum(values) / tick


def comm_cpu_s(name: str) -> float:
    """CPU seconds used by processes named ``name`` (e.g. postgres), including the reaped
    children they waited for, so backends that exit mid-run still count (via the postmaster).
    """
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                head, _, rest = stat.read().rpartition(")")
            if head.split("(", 1)[1] != name:
                continue
            fields = rest.split()
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def hwm_kb(pid: int) -> int:
    """Peak RSS of the process itself since it started (VmHWM)."""
    return _status_kb(pid, "VmHWM")


@dataclass
class RssSampler:
    """Polls the largest VmRSS in each watched process tree; keeps the peak per window."""

    pids: dict[str, int]
    interval_s: float = 0.2
    _peak: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        with self._lock:
            pids = dict(self.pids)
        for name, pid in pids.items():
            rss = largest_rss_kb(pid)
            with self._lock:
                self._peak[name] = max(self._peak.get(name, 0), rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def reset(self) -> None:
        with self._lock:
            self._peak = {}
        self._sample()

    def peak_mb(self, name: str) -> float:
        """The window's sampled peak, or the leader's VmHWM if that is higher."""
        self._sample()
        with self._lock:
            peak, pid = self._peak.get(name, 0), self.pids[name]
        return max(peak, hwm_kb(pid)) / 1024

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)


# --- wrk ---------------------------------------------------------------------------------

_LUA_TEMPLATE = r"""
-- generated by bench/_harness.py
local method = "%(method)s"
local path = "%(path)s"
local body = %(body)s
local base_headers = %(headers)s
local fresh_keys = %(fresh_keys)s
local prefix = "%(prefix)s"
local runs = %(runs)s
local wrk_threads = %(threads)d
local varies = fresh_keys or string.find(body or "", "__N__", 1, true) ~= nil or #runs > 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_no", #threads)
end

function init(args)
  counter = 0
  non2xx = 0
  sample = ""
  if not varies then
    fixed = wrk.format(method, path, base_headers, body)
  end
end

function request()
  if not varies then
    return fixed
  end
  counter = counter + 1
  local headers = {}
  for k, v in pairs(base_headers) do headers[k] = v end
  if fresh_keys then
    headers["Idempotency-Key"] = string.format("%%s-%%d-%%010d", prefix, thread_no, counter)
  end
  -- __N__: a number no other request of the run has (a JSON-RPC id); __RUN__: the run this
  -- request is counted in, round-robin over the runs, so that requests sent at once are in
  -- different runs, as concurrent agents' calls are.
  local sent = string.gsub(body, "__N__", string.format("%%d%%010d", thread_no, counter))
  if #runs > 0 then
    local turn = (counter - 1) * wrk_threads + thread_no - 1
    sent = string.gsub(sent, "__RUN__", runs[turn %% #runs + 1])
  end
  return wrk.format(method, path, headers, sent)
end

function response(status, headers, rbody)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    if sample == "" then
      sample = tostring(status) .. " " .. string.sub(rbody or "", 1, 400)
    end
  end
end

function done(summary, latency, requests)
  local bad, first = 0, ""
  for _, thread in ipairs(threads) do
    bad = bad + (thread:get("non2xx") or 0)
    local s = thread:get("sample") or ""
    if first == "" and s ~= "" then first = s end
  end
  local e = summary.errors
  io.write(string.format(
    "BENCH_RESULT {\"requests\": %%d, \"duration_us\": %%d, \"p50_us\": %%d, \"p90_us\": %%d, " ..
    "\"p99_us\": %%d, \"max_us\": %%d, \"non2xx\": %%d, \"connect\": %%d, \"read\": %%d, " ..
    "\"write\": %%d, \"timeout\": %%d}\n",
    summary.requests, summary.duration, latency:percentile(50.0), latency:percentile(90.0),
    latency:percentile(99.0), latency.max, bad, e.connect, e.read, e.write, e.timeout))
  if first ~= "" then
    io.write("BENCH_SAMPLE " .. first .. "\n")
  end
end
"""


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lua string literal here


def lua_script(
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | None = None,
    fresh_idempotency_keys: bool = False,
    key_prefix: str = "bench",
    runs: Sequence[str] = (),
    threads: int = 1,
) -> str:
    """A wrk script sending ``body`` (each request: ``__N__`` in it made unique and, with
    ``runs``, ``__RUN__`` replaced by the run it is counted in)."""
    lua_headers = (
        "{" + ", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items()) + "}"
    )
    return _LUA_TEMPLATE % {
        "method": method,
        "path": path,
        "body": _lua_string(body.decode()) if body is not None else "nil",
        "headers": lua_headers,
        "fresh_keys": "true" if fresh_idempotency_keys else "false",
        "prefix": key_prefix,
        "runs": "{" + ", ".join(_lua_string(run) for run in runs) + "}",
        "threads": threads,
    }


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    non2xx: int
    socket_errors: int
    sample: str

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def run_wrk(
    procs: Processes,
    url: str,
    script: str,
    *,
    duration_s: float,
    concurrency: int,
    threads: int,
    label: str,
) -> WrkResult:
    """Drive ``url`` with wrk for ``duration_s``; parse the figures the script prints."""
    script_path = procs.log_dir / f"{label}.lua"
    script_path.write_text(script)
    argv = [
        shutil.which("wrk") or "wrk",
        f"-t{threads}",
        f"-c{concurrency}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "10s",
        "-s",
        str(script_path),
        url,
    ]
    proc = procs.start(f"wrk-{label}", argv, os.environ)
    try:
        proc.popen.wait(timeout=duration_s + 60)
    except subprocess.TimeoutExpired:
        raise BenchError(f"wrk {label} did not finish in time") from None
    finally:
        procs.stop(proc)
    output = proc.log.read_text(errors="replace")
    result = sample = None
    for line in output.splitlines():
        if line.startswith("BENCH_RESULT "):
            result = json.loads(line.removeprefix("BENCH_RESULT "))
        elif line.startswith("BENCH_SAMPLE "):
            sample = line.removeprefix("BENCH_SAMPLE ")
    if result is None:
        raise BenchError(f"wrk {label} printed no result:\n{output[-2000:]}")
    return WrkResult(
        requests=result["requests"],
        seconds=result["duration_us"] / 1e6,
        p50_ms=result["p50_us"] / 1000,
        p90_ms=result["p90_us"] / 1000,
        p99_ms=result["p99_us"] / 1000,
        max_ms=result["max_us"] / 1000,
        non2xx=result["non2xx"],
        socket_errors=sum(result[k] for k in ("connect", "read", "write", "timeout")),
        sample=sample or "",
    )


def require_wrk() -> None:
    if shutil.which("wrk") is None:
        raise BenchError("wrk is not installed (apt-get install -y wrk)")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "| "
            + " | ".join(
                c.rjust(w) if n and i > 1 else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
            + " |"
        )
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
