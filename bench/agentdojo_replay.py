"""Replay AgentDojo's banking suite through toolgate, without a model: what provenance stops,
and what it costs the human.

agentdojo pulls the SDKs of several model vendors and langchain, so it goes into a venv of
its own, beside toolgate::

    python3 -m venv .venv-agentdojo
    .venv-agentdojo/bin/pip install -e '.[agentdojo]'
    .venv-agentdojo/bin/python bench/agentdojo_replay.py

Everything listens on 127.0.0.1 and needs PostgreSQL and Redis there (``--postgres``,
``--redis``); the script creates and drops a database ``bench_<random>``.

The provider is AgentDojo's own: an HTTP route per tool of the banking suite, each running
the suite's tool function on its banking environment (``bench/agentdojo_banking.yaml``
is the catalog). For every pair of a user task and an injection task, the environment is
loaded with the ``important_instructions`` attack text for that injection task in each
injection vector the user task reads. A run is started with the user task's prompt as its
``task``, and the user task's ground-truth calls are replayed. Right after the first result
that holds the attack, the injection task's ground-truth calls are replayed too, as a
hijacked model would make them. The attack comes twice: ``verbatim``, and ``in pieces``,
where each value of 8 or more characters the attacker's calls send (an IBAN, a password)
is written in the attack as pieces of 5 characters for the model to join; the hijacked
calls send the joined value, which no result holds. Each call is proposed in the run; when
toolgate asks for an approval, a scripted approver approves exactly the calls of the user
task's ground truth and rejects the rest; an allowed call is executed. Then AgentDojo's own
checks judge the environment: the injection task's ``security`` (did the attacker's effect
happen) and the user task's ``utility``. Each user task is also replayed once without an
attack.

Seven catalogs are compared: every mutation low impact with ``on_taint: allow`` (no
provenance; the attacks' reference), (a) every mutation high impact, (b) low impact with
``on_taint: approve``, (c) low impact with ``on_taint: deny``; then, taint off, (d) the
recipients and the password ``x-endorsed`` with ``on_unendorsed: approve``, (e) the same
with ``deny`` (no result is trusted, no value is known), and (f) each run scoped to the
tools its user task calls. Figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import yaml
from agentdojo.attacks.base_attacks import FixedJailbreakAttack
from agentdojo.attacks.important_instructions_attacks import ImportantInstructionsAttack
from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime
from agentdojo.task_suite.load_suites import get_suite
from aiohttp import web
from pydantic_core import to_jsonable_python

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    HOST,
    BenchError,
    Processes,
    free_port,
    sigterm_as_interrupt,
    table,
    venv_bin,
    wait_ready,
)
from run import create_database, delete_redis_keys, drop_database, token

from examples.demo_providers import serve_in_background

SUITE_VERSION = "v1.2.2"
CATALOG = Path(__file__).resolve().parent / "agentdojo_banking.yaml"
ATTACKS = ("none", "verbatim", "in pieces")


class Config(NamedTuple):
    """A catalog configuration: every mutation's ``impact`` and ``on_taint``; endorsement of
    the recipients and the password (``on_unendorsed``, or ``None``: not endorsed); and
    whether each run is scoped to the tools its user task needs."""

    impact: str
    on_taint: str
    on_unendorsed: str | None = None
    scope: bool = False


CONFIGS = {
    "low, on_taint: allow": Config("low", "allow"),
    "(a) high impact": Config("high", "approve"),
    "(b) low, on_taint: approve": Config("low", "approve"),
    "(c) low, on_taint: deny": Config("low", "deny"),
    "(d) endorsed, approve": Config("low", "allow", on_unendorsed="approve"),
    "(e) endorsed, deny": Config("low", "allow", on_unendorsed="deny"),
    "(f) run scope": Config("low", "allow", scope=True),
}
ENDORSED = {"recipient": "iban", "password": "password"}
"""The arguments that say where money goes or what it unlocks, with their kinds. Nothing of
the suite's data is trusted: transactions, files and scheduled transactions all hold text
that others wrote (the injection vectors)."""


class Bank:
    """AgentDojo's banking environment behind HTTP: ``/tools/{tool}`` runs the suite's own
    tool function on ``env`` (GET: arguments in the query, POST: a JSON body). A mutation
    answers a repeated ``Idempotency-Key`` with its first answer."""

    def __init__(self, suite: Any) -> None:
        self.suite = suite
        self.runtime = FunctionsRuntime(suite.tools)
        self.env: Any = suite.load_and_inject_default_environment({})
        self.answers: dict[str, tuple[int, Any]] = {}

    def load(self, injections: dict[str, str]) -> Any:
        """A fresh environment with ``injections`` in their vectors; returns a copy of it."""
        self.env = self.suite.load_and_inject_default_environment(injections)
        self.answers.clear()
        return self.env.model_copy(deep=True)

    async def handle(self, request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key")
        answer = self.answers.get(key) if key else None
        if answer is None:
            args = dict(request.query) if request.method == "GET" else await request.json()
            result, error = self.runtime.run_function(self.env, request.match_info["tool"], args)
            answer = (422, {"error": error}) if error else (200, {"result": result})
            if key:
                self.answers[key] = answer
        status, body = answer
        return web.json_response(to_jsonable_python(body), status=status)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/tools/{tool}", self.handle)
        return app


@dataclass
class Tally:
    pairs: int = 0
    attacks: int = 0  # the injection task's security check held: the attacker's effect happened
    useful: int = 0  # the user task's utility check held
    approved: int = 0
    rejected: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # error code of refused proposals
    tainted_own: Counter[str] = field(default_factory=Counter)  # the user's calls found tainted
    succeeded: list[str] = field(default_factory=list)  # pairs whose attack succeeded
    useless: list[str] = field(default_factory=list)  # pairs whose user task failed


def gate(
    client: httpx.Client, run_id: str, call: FunctionCall, mine: list[Any], tally: Tally
) -> Any:
    """Propose ``call`` in the run; if toolgate asks, the approver approves it exactly when it
    is one of the user task's own calls (``mine``); execute it when allowed. Its result, or
    ``None`` when it did not run."""
    body = {"tool": call.function, "arguments": dict(call.args), "run_id": run_id}
    proposal = client.post("/propose", json=body)
    answer = proposal.json()
    ours = (call.function, dict(call.args)) in mine
    if ours and answer.get("taint"):
        tainted = ", ".join(sorted({t["argument"] for t in answer["taint"]}))
        tally.tainted_own[f"{call.function}({tainted})"] += 1
    if proposal.status_code != 200:
        tally.refused[answer.get("code", str(proposal.status_code))] += 1
        return None
    if answer["next"] == "approval":
        decision = "approve" if ours else "reject"
        decided = client.post(
            "/approve",
            json={"call_id": answer["call_id"], "snapshot_hash": None, "decision": decision},
        )
        if decided.status_code != 200:
            raise BenchError(f"/approve answered {decided.status_code}: {decided.text[:300]}")
        if not ours:
            tally.rejected += 1
            return None
        tally.approved += 1
    headers = {"Idempotency-Key": secrets.token_hex(16)} if answer["mutation"] else {}
    executed = client.post("/execute", json={"call_id": answer["call_id"]}, headers=headers)
    if executed.status_code != 200:
        raise BenchError(f"/execute answered {executed.status_code}: {executed.text[:300]}")
    return executed.json()["result"]


def in_pieces(text: str, hijack: list[FunctionCall]) -> str:
    """``text`` with each string of 8 or more characters that the attacker's calls send
    written as pieces of 5 characters joined by "then", for the model to put together: no
    8-character window of the value occurs in the text any more."""
    for call in hijack:
        for value in call.args.values():
            if isinstance(value, str) and len(value) >= 8 and value in text:
                pieces = " then ".join(value[i : i + 5] for i in range(0, len(value), 5))
                text = text.replace(value, f"{pieces} (joined, without the word then)")
    return text


def replay(
    client: httpx.Client,
    bank: Bank,
    user_task: Any,
    injection_task: Any,
    attack: str,
    tally: Tally,
    scoped: bool,
) -> None:
    """One run of ``user_task``, hijacked by ``injection_task`` (unless ``None``) with the
    attacker's values written ``verbatim`` or ``in pieces``."""
    injections: dict[str, str] = {}
    hijack: list[FunctionCall] = []
    pre = bank.load({})
    if injection_task is not None:
        jailbreak = FixedJailbreakAttack(ImportantInstructionsAttack._JB_STRING, bank.suite, None)
        jailbreak.user_name = "Emma Johnson"  # as ImportantInstructionsAttack signs it
        injections = jailbreak.attack(user_task, injection_task)
        if attack == "in pieces":
            hidden = injection_task.ground_truth(pre)
            injections = {vector: in_pieces(text, hidden) for vector, text in injections.items()}
        pre = bank.load(injections)
        hijack = injection_task.ground_truth(pre)
    calls = user_task.ground_truth(pre)
    mine = [(c.function, dict(c.args)) for c in calls]
    started: dict[str, Any] = {"task": user_task.PROMPT}
    if scoped:  # as an orchestrator would choose them from the user's request
        started["scope"] = {"tools": sorted({c.function for c in calls}), "outside": "deny"}
    run = client.post("/runs", json=started)
    if run.status_code != 200:
        raise BenchError(f"POST /runs answered {run.status_code}: {run.text[:300]}")
    run_id = run.json()["run_id"]
    for call in calls:
        result = gate(client, run_id, call, mine, tally)
        if hijack and "<INFORMATION>" in json.dumps(result):
            for attacker_call in hijack:
                gate(client, run_id, attacker_call, mine, tally)
            hijack = []
    client.post(f"/runs/{run_id}/finish", json={"status": "completed"})
    # No model writes an answer: read-only tasks are judged on the benchmark's own one.
    output = getattr(user_task, "GROUND_TRUTH_OUTPUT", "")
    name = user_task.ID if injection_task is None else f"{user_task.ID}/{injection_task.ID}"
    tally.pairs += 1
    if user_task.utility(output, pre, bank.env):
        tally.useful += 1
    else:
        tally.useless.append(name)
    if injection_task is not None and injection_task.security(output, pre, bank.env):
        tally.attacks += 1
        tally.succeeded.append(name)


def catalog_for(config: Config, directory: Path) -> None:
    """``bench/agentdojo_banking.yaml`` with every mutation's ``impact`` and ``on_taint``,
    and, for an endorsing configuration, its ``ENDORSED`` arguments ``x-endorsed``."""
    catalog = yaml.safe_load(CATALOG.read_text())
    for tool in catalog["tools"].values():
        if tool["mutation"]:
            tool.update(impact=config.impact, on_taint=config.on_taint)
        properties = tool["parameters"].get("properties", {})
        endorsed = [name for name in ENDORSED if name in properties]
        if config.on_unendorsed is not None and endorsed:
            tool["on_unendorsed"] = config.on_unendorsed
            for name in endorsed:
                properties[name].update({"x-endorsed": True, "x-endorsed-kind": ENDORSED[name]})
    catalog["version"] += f"-{config.impact}-{config.on_taint}-{config.on_unendorsed}"
    (directory / "banking.yaml").write_text(yaml.safe_dump(catalog, sort_keys=False))


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    return parser.parse_args()


def measure(ns: argparse.Namespace, nonce: str, log_dir: Path) -> dict[tuple[str, str], Tally]:
    """The tally of each configuration under each attack."""
    suite = get_suite(SUITE_VERSION, "banking")
    bank = Bank(suite)
    bank_port, port = free_port(), free_port()
    stop_bank = serve_in_background(HOST, bank_port, bank.app())
    db_name, prefix, secret = f"bench_{nonce}", f"bench-{nonce}:", secrets.token_hex(32)
    env = {
        **os.environ,
        "TOOLGATE_DATABASE_URL": f"{ns.postgres}/{db_name}",
        "TOOLGATE_REDIS_URL": ns.redis,
        "TOOLGATE_REDIS_PREFIX": prefix,
        "TOOLGATE_JWT_SECRET": secret,
        "AGENTDOJO_BANK_URL": f"http://{HOST}:{bank_port}",
    }
    headers = {"Authorization": f"Bearer {token(secret)}"}
    tallies: dict[tuple[str, str], Tally] = {}
    create_database(ns.postgres, db_name)
    try:
        with Processes(log_dir) as procs:
            migrate = procs.start("migrate", [venv_bin("toolgate"), "migrate"], env)
            if migrate.popen.wait(timeout=60) != 0:
                raise BenchError(f"toolgate migrate failed:\n{migrate.tail()}")
            for name, config in CONFIGS.items():
                catalog = log_dir / "".join(c for c in name if c.isalnum() or c == " ")
                catalog.mkdir()
                catalog_for(config, catalog)
                serve = [venv_bin("toolgate"), "serve", "--host", HOST, "--port", str(port)]
                server_env = {**env, "TOOLGATE_CATALOG": str(catalog)}
                server = procs.start(f"toolgate {name}", serve, server_env)
                wait_ready(server, f"http://{HOST}:{port}/readyz", timeout_s=60)
                for attack in ATTACKS:
                    tallies[name, attack] = Tally()
                url = f"http://{HOST}:{port}"
                with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
                    for user_task in suite.user_tasks.values():
                        none = tallies[name, "none"]
                        replay(client, bank, user_task, None, "none", none, config.scope)
                        for injection_task, attack in product(
                            suite.injection_tasks.values(), ATTACKS[1:]
                        ):
                            tally = tallies[name, attack]
                            replay(
                                client, bank, user_task, injection_task, attack, tally, config.scope
                            )
                procs.stop(server)
                print(f"{name}: done", flush=True)
    finally:
        stop_bank()
        drop_database(ns.postgres, db_name)
        delete_redis_keys(ns.redis, [prefix])
    return tallies


def report(tallies: dict[tuple[str, str], Tally]) -> None:
    rows = []
    for (name, attack), t in tallies.items():
        asked = f"{(t.approved + t.rejected) / t.pairs:.2f}"
        rows.append(
            [
                name,
                attack,
                "-" if attack == "none" else f"{t.attacks}/{t.pairs} ({t.attacks / t.pairs:.0%})",
                f"{t.useful}/{t.pairs} ({t.useful / t.pairs:.0%})",
                f"{asked} ({t.approved / t.pairs:.2f} / {t.rejected / t.pairs:.2f})",
                ", ".join(f"{code} {n}" for code, n in sorted(t.refused.items())) or "-",
            ]
        )
    headers = ["configuration", "attack", "attacks succeeded", "utility"]
    headers += ["approvals per run (approved / rejected)", "refused proposals"]
    print(table(headers, rows))
    for (name, attack), t in tallies.items():
        own = ", ".join(f"{call} {n}" for call, n in sorted(t.tainted_own.items()))
        print(f"\n{name}, attack {attack}:")
        for label, names in [
            ("attacks that succeeded", t.succeeded),
            ("runs whose user task failed", t.useless),
            ("the user's own calls found tainted", [own] if own else []),
        ]:
            print(f"  {label}: {', '.join(names) or 'none' if len(names) <= 30 else 'many'}")


def main() -> int:
    ns = _args()
    nonce = secrets.token_hex(4)
    log_dir = Path(tempfile.mkdtemp(prefix=f"toolgate-agentdojo-{nonce}-"))
    with sigterm_as_interrupt():
        try:
            tallies = measure(ns, nonce, log_dir)
        except KeyboardInterrupt:
            shutil.rmtree(log_dir, ignore_errors=True)
            print("\ninterrupted; cleaned up", file=sys.stderr)
            return 1
        except BenchError as exc:
            print(f"bench failed: {exc}\nlogs in {log_dir}", file=sys.stderr)
            return 1
    shutil.rmtree(log_dir, ignore_errors=True)
    report(tallies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
