"""An outside fuzzer against the served OpenAPI document: schemathesis's command line, as any
tester would run it, against a real ``toolgate serve`` with the demo providers.

It runs every phase (the document's examples, coverage of each schema's edges, fuzzing,
and stateful sequences that follow the document's links: propose → dry-run → approve →
execute by ``call_id``, and a run's id into calls made in it), as principals whose roles
reach every operation: a support agent, a finance approver (``/approve``, ``/approvals``)
and an auditor who is also an admin (``/audit…``). It fails on any 5xx, any answer the
document does not describe (status, content type, headers, body), and any operation that
answers without the token it requires (``ignored_auth``).

The seed and the number of examples are fixed, so CI runs the same cases in well under a
minute; ``TOOLGATE_FUZZ_EXAMPLES`` (examples per operation) and ``TOOLGATE_FUZZ_SEED`` make
a longer or another run locally, e.g. ``TOOLGATE_FUZZ_EXAMPLES=1000 bash scripts/test.sh -k
schemathesis``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

import asyncpg

from tests.conftest import ROOT, Providers
from tests.test_instances import Instance

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "ignored_auth",
)
CONFIG = """\
headers = { Authorization = "Bearer ${FUZZ_SUPPORT}" }

[[operations]]
include-path-regex = "^/(approve|approvals)$"
headers = { Authorization = "Bearer ${FUZZ_APPROVER}" }

[[operations]]
include-path-regex = "^/audit"
headers = { Authorization = "Bearer ${FUZZ_AUDITOR}" }

# The document's own links only: schemathesis's guesses (a run's id into every path with a
# run_id) would start most sequences from POST /runs and rarely reach an approval.
[phases.stateful]
max-steps = 8

[phases.stateful.inference]
algorithms = []
"""


async def test_schemathesis_finds_no_server_error_and_no_answer_the_document_does_not_describe(
    env: dict[str, str],
    token: Callable[..., str],
    providers: Providers,
    db: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    served = Instance(env, log=tmp_path / "toolgate.log")
    try:
        await served.ready()
        (tmp_path / "schemathesis.toml").write_text(CONFIG)
        # Not subprocess.run: the demo providers are served by this test's event loop.
        fuzzer = await asyncio.create_subprocess_exec(
            *[
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(tmp_path / "schemathesis.toml"),
                "run",
                f"{served.url}/openapi.json",
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--checks",
                ",".join(CHECKS),
                "--seed",
                os.environ.get("TOOLGATE_FUZZ_SEED", "20261205"),
                "--max-examples",
                os.environ.get("TOOLGATE_FUZZ_EXAMPLES", "100"),
                "--request-timeout",
                "30",
                "--no-color",
                "--report",
                "ndjson",
                "--report-dir",
                str(tmp_path / "report"),
            ],
            cwd=tmp_path,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "SCHEMATHESIS_HOOKS": "tests.fuzz_hooks",
                "FUZZ_SUPPORT": token("alice", "acme", "support"),
                "FUZZ_APPROVER": token("bob", "acme", "finance_approver"),
                "FUZZ_AUDITOR": token("erin", "acme", "auditor,admin"),
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(fuzzer.communicate(), 600)
    finally:
        served.stop()
    report = output.decode(errors="replace")[-20_000:]
    assert fuzzer.returncode == 0, report
    # The links carried generated calls through every step, not only to 404s.
    reached = {
        table: await db.fetchval(f"SELECT count(*) FROM {table}")
        for table in ("runs", "calls", "dry_runs", "approvals", "executions")
    }
    assert all(reached.values()), reached
    assert b"Traceback" not in (tmp_path / "toolgate.log").read_bytes()
