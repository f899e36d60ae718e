"""toolgate with bench-only tweaks, to size suggested changes before anyone makes them.

Runs ``toolgate serve`` itself (``app.cli.main``: same preflight, logging config, uvloop +
httptools, settings from ``TOOLGATE_*``) with some settings changed by patching at start-up.
An experiment only: the tweaks belong in app/ if the figures justify them. ``bench/run.py
--variant`` starts this next to the real ``toolgate serve``.

Tweaks (comma-separated, ``--tweaks``):

* ``count_queries`` -- no change in behaviour: every SQL statement the pool runs (BEGIN,
  COMMIT and asyncpg's reset included) is counted by kind, and the counts are written to
  stderr as one ``QUERY_COUNTS {...}`` JSON line at shutdown. Only the worker's: the audit
  sealer runs in a process of its own.
* ``no_spans`` -- a tracer provider whose sampler records nothing;
* ``quiet_logs`` -- toolgate's loggers at WARNING (no line per decision).

Earlier tweaks that app/ has since adopted (no access log, no asyncpg reset on release, a
faster canonical JSON) or made moot (the sealer's wake-ups, no sealer: sealing has left the
worker) are gone; see ``bench/README.md`` for what they measured.

Run: ``python bench/toolgate_variants.py --port 8282 --tweaks no_spans,quiet_logs``.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from collections import Counter
from typing import Any

TWEAKS = (
    "count_queries",
    "no_spans",
    "quiet_logs",
)


def apply(tweaks: set[str]) -> None:
    if "count_queries" in tweaks:
        count_queries()
    if "no_spans" in tweaks:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

        trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_OFF))
    if "quiet_logs" in tweaks:
        from app import logs

        real_config = logs.log_config
        logs.log_config = lambda level="INFO": real_config("WARNING")  # type: ignore[assignment]


def _kind(sql: str) -> str:
    """``INSERT calls``, ``SELECT executions``, ``BEGIN``, ``reset`` ... for one statement."""
    text = " ".join(sql.split())
    if "pg_advisory_unlock_all" in text or text.upper().startswith("RESET ALL"):
        return "reset (asyncpg pool release)"
    verb = text.split(" ", 1)[0].upper().rstrip(";") if text else "?"
    if verb in ("BEGIN", "COMMIT", "ROLLBACK"):
        return verb
    table = re.search(r"\b(?:INTO|FROM|UPDATE)\s+([a-z_]+)", text, re.IGNORECASE)
    return f"{verb} {table.group(1) if table else '...'}"


def count_queries() -> None:
    import asyncpg

    counts: Counter[str] = Counter()
    real_create_pool = asyncpg.create_pool

    def create_pool(*args: Any, **kwargs: Any) -> Any:
        user_init = kwargs.get("init")

        async def init(conn: Any) -> None:
            conn.add_query_logger(lambda query: counts.update([_kind(query.query)]))
            if user_init is not None:
                await user_init(conn)

        kwargs["init"] = init
        return real_create_pool(*args, **kwargs)

    asyncpg.create_pool = create_pool

    def dump() -> None:
        print("QUERY_COUNTS " + json.dumps(dict(counts.most_common())), file=sys.stderr)

    def on_sigterm(signum: int, frame: object) -> None:
        # uvicorn restores this handler after its graceful shutdown and re-raises SIGTERM.
        dump()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tweaks", default="", help=f"comma-separated: {', '.join(TWEAKS)}")
    ns = parser.parse_args()
    tweaks = {t for t in ns.tweaks.split(",") if t}
    unknown = tweaks - set(TWEAKS)
    if unknown:
        parser.error(f"unknown tweaks: {sorted(unknown)}")
    apply(tweaks)
    from app.cli import main as toolgate

    return toolgate(["serve", "--host", ns.host, "--port", str(ns.port), "--workers", "1"])


if __name__ == "__main__":
    sys.exit(main())
