"""``toolgate test``: a catalog's policy tested offline, with no database, Redis or provider.

A test file (``*_test.yaml``) names the catalog it tests and gives what the service would
look up: who the principals are, who owns each resource, the tenant's known values, what
host names resolve to, and for a call in a run its task, scope and the results it was given.
Each case proposes a call and states what toolgate must decide. The decision is the
service's own: the same ``policy.prepare``, ``policy.precheck`` and ``policy.decide``, with
``Facts`` built from the file the way the service builds them from its stores (a run
remembers an untrusted result's windows and a trusted result's words, as
``app.runs.service`` does). What needs the stores (run budgets, idempotency, approvals)
is not decided here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple
from xml.etree import ElementTree

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from app.auth.principal import Principal
from app.calls import egress, policy
from app.calls.policy import Decision, Facts, PreparedCall
from app.calls.states import Next
from app.catalog.loader import CatalogError, load
from app.catalog.models import Catalog, Impact, Owner
from app.catalog.source import Problem, read
from app.errors import TaintedArguments, ToolgateError, UnendorsedArguments, UnknownTool
from app.runs import comparison, endorsement, provenance
from app.runs.endorsement import Source, Sources, Text

PATTERN = "*_test.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrincipalSpec(_Strict):
    tenant: str = Field(min_length=1)
    roles: list[str] = []


class OwnerSpec(_Strict):
    tenant: str = Field(min_length=1)
    user: str | None = None


class Call(_Strict):
    tool: str
    arguments: dict[str, JsonValue] = {}


class Given(_Strict):
    """A result the run was given earlier: trusted or not as the catalog marks its tool."""

    tool: str
    arguments: dict[str, JsonValue] = {}
    """The call's arguments: strings of the result that only echo them are not news."""
    result: JsonValue


class ScopeSpec(_Strict):
    tools: list[str]
    outside: Literal["deny", "approve"] = "deny"


class RunSpec(_Strict):
    task: str | None = None
    results: list[Given] = []
    scope: ScopeSpec | None = None


class Expect(_Strict):
    """What toolgate must decide; only the keys given are compared."""

    decision: Literal["allow", "deny"] | None = None
    code: str | None = None
    next: Next | None = None
    impact: Impact | None = None
    taint: list[str] | None = None
    """The arguments found tainted, in any order (``[]``: none)."""
    endorsement: dict[str, Source | Literal["none"]] | None = None
    """Each ``x-endorsed`` argument present: what endorses it, or ``none``."""


class Case(_Strict):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    as_: str = Field(alias="as")
    propose: Call
    run: RunSpec | None = None
    expect: Expect


class KnownSpec(_Strict):
    """A known value of scope ``user``: it endorses only calls made as ``user``."""

    value: str
    user: str


class TestFile(_Strict):
    catalog: str
    """The catalog file or directory, relative to the test file."""
    principals: dict[str, PrincipalSpec]
    owners: dict[str, dict[str, OwnerSpec]] = {}
    """Resource type → id → owner; a resource not named here does not exist."""
    known: dict[str, dict[str, list[str | KnownSpec]]] = {}
    """Tenant → kind → its known values: a value alone is the tenant's, ``{value, user}``
    that user's own (scope ``user``)."""
    addresses: dict[str, list[str]] = {}
    """Host name → the addresses it resolves to; a host not named here does not resolve."""
    cases: list[Case] = Field(min_length=1)


class Got(NamedTuple):
    decision: Literal["allow", "deny"]
    code: str | None
    next: Next | None
    impact: Impact | None
    taint: list[str]
    endorsement: dict[str, str]


class Outcome(NamedTuple):
    """One case: where it is written, and what differs from what it expected."""

    file: str
    line: int | None
    name: str
    differences: dict[str, tuple[Any, Any]]
    """Key → (expected, got); empty when the case passed."""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        if not self.differences:
            return f"{where}: {self.name}: ok"
        told = ", ".join(
            f"{key}: expected {want!r}, got {got!r}"
            for key, (want, got) in self.differences.items()
        )
        return f"{where}: {self.name}: {told}"


class Malformed(Exception):
    """A test file that cannot be run, with the place of each problem."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


def files(paths: Iterable[Path]) -> list[Path]:
    """The test files named, and those under the directories named."""
    found: list[Path] = []
    for path in paths:
        found.extend(sorted(path.rglob(PATTERN)) if path.is_dir() else [path])
    return found


def run_file(path: Path) -> list[Outcome]:
    """Every case of the test file at ``path``; raises ``Malformed`` if it cannot be run."""
    source = read(path)
    if source.problems:
        raise Malformed(source.problems)
    try:
        spec = TestFile.model_validate(source.document)
    except ValidationError as exc:
        for error in exc.errors():
            source.problem(tuple(error["loc"]), error["msg"])
        raise Malformed(source.problems) from None
    try:
        catalog = load(path.parent / spec.catalog, os.environ)
    except CatalogError as exc:
        raise Malformed(exc.problems) from None
    except OSError as exc:
        source.problem(("catalog",), f"cannot be read: {exc.strerror}")
        raise Malformed(source.problems) from None
    outcomes = []
    for number, case in enumerate(spec.cases):
        where = source.lines.get(("cases", number), (str(path), 0))
        if case.as_ not in spec.principals:
            source.problem(("cases", number, "as"), f"no principal named {case.as_!r}")
            raise Malformed(source.problems)
        got = decide(catalog, spec, case)
        outcomes.append(Outcome(where[0], where[1] or None, case.name, _differences(case, got)))
    return outcomes


def decide(catalog: Catalog, spec: TestFile, case: Case) -> Got:
    """What the service decides on ``case``'s proposal, given the file's facts."""
    who = spec.principals[case.as_]
    principal = Principal(case.as_, who.tenant, frozenset(who.roles))
    tool = catalog.tools.get(case.propose.tool)
    call: PreparedCall | None = None
    try:
        if tool is None:
            raise UnknownTool(f"no tool named {case.propose.tool!r} in the catalog")
        call = policy.prepare(tool, policy.completed(tool, principal, case.propose.arguments))
        policy.precheck(principal, call)
        decision = policy.decide(principal, call, facts(catalog, spec, case, call, principal))
    except ToolgateError as error:
        return _refused(error)
    return _allowed(decision)


def facts(
    catalog: Catalog, spec: TestFile, case: Case, call: PreparedCall, principal: Principal
) -> Facts:
    run = case.run
    owners = {
        arg: _owner(spec.owners.get(resource.type, {}).get(rid))
        for arg, resource, rid in call.resources
    }
    addresses: dict[str, tuple[str, ...]] = {}
    for arg, url in call.egress:
        host = policy.egress_host(url)
        if host is None:
            addresses[arg] = ()
        else:
            addresses[arg] = egress.literal(host) or tuple(spec.addresses.get(host, ()))
    return Facts(
        owners=owners,
        addresses=addresses,
        recall=_recall(catalog, run, call),
        sources=_sources(catalog, spec, run, call, principal),
        scope=policy.Scope(frozenset(run.scope.tools), run.scope.outside)
        if run is not None and run.scope is not None
        else None,
    )


def _owner(spec: OwnerSpec | None) -> Owner | None:
    return Owner(spec.tenant, spec.user) if spec is not None else None


def _told(catalog: Catalog, run: RunSpec | None) -> Iterator[tuple[int, endorsement.Told]]:
    """What each of the run's results (numbered from 1) told it, as the service's run memory
    is told (``endorsement.told``): a result of a tool the catalog lacks is untrusted, as
    every result is unless its tool says so."""
    for number, given in enumerate(run.results if run is not None else (), 1):
        tool = catalog.tools.get(given.tool)
        trusted = tool.trusted if tool is not None else ()
        yield number, endorsement.told(given.result, trusted, given.arguments, succeeded=True)


def _recall(catalog: Catalog, run: RunSpec | None, call: PreparedCall) -> provenance.Recall | None:
    """What the run remembers of the call's arguments, as the service's run memory would:
    each untrusted result's windows, with the first result that held each (``result N``)."""
    candidates = policy.taint_candidates(call) if run is not None else []
    if run is None or not candidates:
        return None
    found: dict[int, str] = {}
    forgotten_after = None
    for number, told in _told(catalog, run):
        if told.windows is None or len(found) + len(told.windows) > provenance.MAX_WINDOWS:
            forgotten_after = f"result {number}"
            break
        for window in told.windows:
            found.setdefault(window, f"result {number}")
    return provenance.Recall(run.task, found, forgotten_after)


def _sources(
    catalog: Catalog, spec: TestFile, run: RunSpec | None, call: PreparedCall, caller: Principal
) -> Sources | None:
    endorsed = call.tool.endorsed_args
    if not endorsed:
        return None
    task = Text.stored(endorsement.formed([run.task])) if run is not None and run.task else None
    trusted: list[Text] = []
    kept = 0
    for _, told in _told(catalog, run):
        if told.vouched and kept + len(told.vouched) <= endorsement.MAX_TRUSTED_CHARS:
            trusted.append(Text.stored(told.vouched))
            kept += len(told.vouched)
    known = {
        (kind, comparison.form(value if isinstance(value, str) else value.value))
        for kind, values in spec.known.get(caller.tenant, {}).items()
        for value in values
        if isinstance(value, str) or value.user == caller.sub
    }
    wanted = set(endorsement.candidates(endorsed, call.arguments))
    return Sources(task, tuple(trusted), frozenset(known & wanted))


def _allowed(decision: Decision) -> Got:
    return Got(
        decision="allow",
        code=None,
        next=decision.next,
        impact=decision.impact,
        taint=sorted({t.argument for t in decision.taint}),
        endorsement={e.argument: e.source or "none" for e in decision.endorsement},
    )


def _refused(error: ToolgateError) -> Got:
    taint = error.extra.get("taint", []) if isinstance(error, TaintedArguments) else []
    endorsed = error.extra.get("endorsement", []) if isinstance(error, UnendorsedArguments) else []
    return Got(
        decision="deny",
        code=error.code,
        next=None,
        impact=None,
        taint=sorted({t["argument"] for t in taint}),
        endorsement={e["argument"]: e["source"] or "none" for e in endorsed},
    )


def _differences(case: Case, got: Got) -> dict[str, tuple[Any, Any]]:
    expected = case.expect.model_dump(exclude_unset=True)
    if "taint" in expected:
        expected["taint"] = sorted(set(expected["taint"]))
    return {
        key: (want, getattr(got, key))
        for key, want in expected.items()
        if want != getattr(got, key)
    }


def junit(outcomes: list[Outcome], problems: list[Problem]) -> bytes:
    """JUnit XML: one test case per case; a file that could not be run is an error."""
    suite = ElementTree.Element("testsuite", name="toolgate test")
    for outcome in outcomes:
        case = ElementTree.SubElement(
            suite, "testcase", classname=outcome.file, name=outcome.name, line=str(outcome.line)
        )
        if outcome.differences:
            ElementTree.SubElement(case, "failure", message=str(outcome)).text = str(outcome)
    for problem in problems:
        case = ElementTree.SubElement(suite, "testcase", classname=problem.file, name="(file)")
        ElementTree.SubElement(case, "error", message=str(problem)).text = str(problem)
    failed = sum(1 for o in outcomes if o.differences)
    suite.set("tests", str(len(outcomes) + len(problems)))
    suite.set("failures", str(failed))
    suite.set("errors", str(len(problems)))
    written: bytes = ElementTree.tostring(suite, encoding="utf-8", xml_declaration=True)
    return written
