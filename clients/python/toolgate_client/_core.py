"""The client's one implementation, free of I/O.

Each operation is a *plan*: a generator that yields the HTTP requests (and the pauses between
retries) it needs, receives each answer, and returns the result. ``Client`` and
``AsyncClient`` only carry plans out, one with ``httpx.Client`` and ``time.sleep``, the other
with ``httpx.AsyncClient`` and ``asyncio.sleep``, so their behaviour cannot drift apart. A
transport failure is thrown into the plan, which decides whether it may try again.
"""

from __future__ import annotations

import functools
import json
import random
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Generator, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Concatenate, Generic, ParamSpec, TypeVar, Unpack, cast, overload
from urllib.parse import quote

import httpx

from toolgate_client.errors import ToolgateError
from toolgate_client.models import (
    JSON,
    Approval,
    AuditFilters,
    Call,
    Catalog,
    DryRun,
    Execution,
    Format,
    Outside,
    Page,
    Proposal,
    Run,
    RunEnd,
)

T = TypeVar("T")
P = ParamSpec("P")

MAX_WAIT_S = 60.0
"""The longest ``GET /calls/{id}?wait=`` the server accepts; longer waits are several."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    json: JSON | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(
            self.method, self.path, json=self.json, params=self.params, headers=self.headers
        )


@dataclass(frozen=True)
class Pause:
    seconds: float


Plan = Generator[Request | Pause, httpx.Response | None, T]


@dataclass(frozen=True)
class Retry:
    """How ``execute`` retries an action whose outcome is unknown or that never ran.

    Retried, always with the same idempotency key: ``504 provider_timeout`` (toolgate then
    reconciles with the provider, so the action happens at most once), ``409
    idempotency_in_flight`` (an earlier attempt is still running), ``502
    provider_unavailable`` and ``503 unavailable`` (nothing was sent), and a connection that
    failed or a gateway's own ``502``/``503``/``504`` (not a problem document: toolgate's
    answer, if any, was lost; the same key makes the retry a replay). Never retried: every
    other answer, refusals above all.
    """

    attempts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def pause(self, attempt: int) -> Pause:
        """Exponential backoff with jitter, so that many agents do not retry in step."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return Pause(ceiling * random.uniform(0.5, 1.0))


RETRIED = {
    (504, "provider_timeout"),
    (409, "idempotency_in_flight"),
    (502, "provider_unavailable"),
    (503, "unavailable"),
    (502, "unexpected_response"),
    (503, "unexpected_response"),
    (504, "unexpected_response"),
}


EXECUTION_FIELDS = [f.name for f in fields(Execution) if f.name != "idempotency_key"]
"""What ``Execution`` takes from an answer; members a newer server adds are left aside."""


def new_idempotency_key() -> str:
    """A fresh key for one intended action (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def error_of(response: httpx.Response) -> ToolgateError:
    problem = _json_object(response)
    if problem is None:
        return _unexpected(response)
    return ToolgateError(response.status_code, problem)


def object_of(response: httpx.Response) -> JSON:
    """A success's JSON object; any other body (a proxy's page) is an unexpected answer,
    raised as a ``ToolgateError`` like every other failure (for ``execute``, with the key
    of an action that may have run)."""
    answered = _json_object(response)
    if answered is None:
        raise _unexpected(response)
    return answered


def _unexpected(response: httpx.Response) -> ToolgateError:
    """An answer that is not what toolgate sends (a proxy's page, say)."""
    problem = {"code": "unexpected_response", "detail": response.text[:500]}
    return ToolgateError(response.status_code, problem)


def _json_object(response: httpx.Response) -> JSON | None:
    try:
        found = response.json()
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def answer(request: Request) -> Plan[httpx.Response]:
    """One request, no retry: the answer if it is a success, else its error raised."""
    response = yield request
    assert response is not None
    if response.is_success:
        return response
    raise error_of(response)


def answered(request: Request, **shape: type | tuple[type, ...]) -> Plan[JSON]:
    """One request, no retry: the JSON object of its success, else its error raised. The
    members an operation reads on (``shape``: name and type) must be there: an object of
    another shape is an unexpected answer too, not a ``KeyError`` further on."""
    response = yield from answer(request)
    found = object_of(response)
    if not all(isinstance(found.get(name), kind) for name, kind in shape.items()):
        raise _unexpected(response)
    return found


def answer_retrying(request: Request, retry: Retry) -> Plan[httpx.Response]:
    """``request`` sent until it succeeds, is refused, or ``retry.attempts`` run out."""
    for attempt in range(1, retry.attempts + 1):
        try:
            return (yield from answer(request))
        except ToolgateError as error:
            if (error.status, error.code) not in RETRIED or attempt == retry.attempts:
                raise
        except httpx.TransportError as failure:
            if attempt == retry.attempts:
                raise ToolgateError(0, {"code": "unreachable", "detail": str(failure)}) from failure
        yield retry.pause(attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


def body(**fields: Any) -> JSON:
    """A request body without the fields left out (``None``)."""
    return {name: value for name, value in fields.items() if value is not None}


class Walk(Generic[T]):
    """Carries a plan step by step: iterate for its steps, hand in each request's answer
    (``answer``) or transport failure (``fail``); then ``result`` holds what it returned."""

    def __init__(self, plan: Plan[T]) -> None:
        self._plan = plan
        self._next: Callable[[], Request | Pause] = functools.partial(next, plan)
        self.result: T

    def __iter__(self) -> Iterator[Request | Pause]:
        while True:
            try:
                step = self._next()
            except StopIteration as done:
                self.result = done.value
                return
            self._next = functools.partial(self._plan.send, None)
            yield step

    def answer(self, response: httpx.Response) -> None:
        self._next = functools.partial(self._plan.send, response)

    def fail(self, failure: httpx.TransportError) -> None:
        self._next = functools.partial(self._plan.throw, failure)


class SyncRunner(ABC):
    @abstractmethod
    def _run(self, plan: Plan[T]) -> T: ...


class AsyncRunner(ABC):
    @abstractmethod
    async def _run(self, plan: Plan[T]) -> T: ...


class operation(Generic[P, T]):
    """Turns a plan method into a method of both clients: on a ``Client`` it returns the
    result, on an ``AsyncClient`` an awaitable of it."""

    def __init__(self, plan: Callable[Concatenate[Any, P], Plan[T]]) -> None:
        self.plan = plan

    @overload
    def __get__(self, client: SyncRunner, owner: type) -> Callable[P, T]: ...

    @overload
    def __get__(self, client: AsyncRunner, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, client: Any, owner: type) -> Any:
        plan = self.plan

        @functools.wraps(plan)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return client._run(plan(client, *args, **kwargs))

        return bound


class Operations:
    """Every call of the API, written once. ``retry`` governs ``execute`` only: the other
    operations are not idempotent (a proposal records a call) or are cheap to repeat."""

    _http_class: ClassVar[type[httpx.Client] | type[httpx.AsyncClient]]
    _http: httpx.Client | httpx.AsyncClient

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        retry: Retry | None = None,
        timeout: float = 75.0,
        **httpx_options: Any,
    ) -> None:
        """toolgate at ``base_url``, as the user of ``token`` (a bearer JWT). ``transport``
        and other keyword arguments go to httpx; ``timeout`` exceeds the longest single
        wait of ``wait_for_call`` (60 s), so that the server answers it first."""
        self.retry = retry or Retry()
        headers = {"Authorization": f"Bearer {token}"}
        self._http = self._http_class(
            base_url=base_url, headers=headers, timeout=timeout, **httpx_options
        )

    @operation
    def propose(
        self,
        tool: str,
        arguments: JSON,
        *,
        run_id: str | None = None,
        tool_call_id: str | None = None,
    ) -> Plan[Proposal]:
        """Ask whether ``tool`` may run with ``arguments``; a refusal raises."""
        payload = body(tool=tool, arguments=arguments, run_id=run_id, tool_call_id=tool_call_id)
        return cast(Proposal, (yield from answered(Request("POST", "/propose", payload))))

    @operation
    def dry_run(self, call_id: str) -> Plan[DryRun]:
        """Preview a proposed call's effect; the preview is what an approver sees."""
        return cast(
            DryRun, (yield from answered(Request("POST", "/dry-run", {"call_id": call_id})))
        )

    @operation
    def approve(
        self,
        call_id: str,
        snapshot_hash: str | None,
        *,
        decision: str = "approve",
        comment: str | None = None,
    ) -> Plan[Approval]:
        """Decide on a high-impact call as this client's user (``decision="reject"`` too).
        ``snapshot_hash`` is the hash of the preview the human saw (``None`` without one)."""
        payload = body(call_id=call_id, decision=decision, comment=comment)
        payload["snapshot_hash"] = snapshot_hash
        return cast(Approval, (yield from answered(Request("POST", "/approve", payload))))

    @operation
    def execute(
        self,
        call_id: str | None = None,
        *,
        tool: str | None = None,
        arguments: JSON | None = None,
        approval_id: str | None = None,
        dry_run_id: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Plan[Execution]:
        """Run a call: a proposed one by ``call_id`` (on its own approval), or ``tool`` with
        ``arguments``. One key stands for this one action: the one given, or a new one,
        sent on every retry and returned with the result (and on the error) so that a later
        retry can send it again. Retries follow ``self.retry``."""
        key = idempotency_key or new_idempotency_key()
        payload = body(
            call_id=call_id,
            tool=tool,
            arguments=arguments,
            approval_id=approval_id,
            dry_run_id=dry_run_id,
            run_id=run_id,
        )
        request = Request("POST", "/execute", payload, headers={"Idempotency-Key": key})
        try:
            response = yield from answer_retrying(request, self.retry)
            answered = object_of(response)
        except ToolgateError as error:
            error.idempotency_key = key
            raise
        known: dict[str, Any] = {name: answered.get(name) for name in EXECUTION_FIELDS}
        return Execution(idempotency_key=key, **known)

    @operation
    def call(self, call_id: str) -> Plan[Call]:
        """A call's whole life: its state, decisions, previews, approval and executions."""
        return cast(
            Call, (yield from answered(Request("GET", f"/calls/{quote(call_id, safe='')}")))
        )

    @operation
    def wait_for_call(self, call_id: str, timeout: float = 60.0) -> Plan[Call]:
        """The call once it no longer waits (for a preview, a decision, or its execution),
        or as it is when ``timeout`` seconds have passed: check its ``state``."""
        if not timeout >= 0:  # NaN too: it would never pass
            raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        deadline = time.monotonic() + timeout
        while True:
            remaining = min(MAX_WAIT_S, deadline - time.monotonic())
            params = {"wait": f"{remaining:.3f}"} if remaining > 0.001 else {}
            request = Request("GET", f"/calls/{quote(call_id, safe='')}", params=params)
            found = cast(Call, (yield from answered(request, state=str, proposal=dict)))
            if not params or not waiting(found):
                return found

    @operation
    def approvals(self, status: str = "pending") -> Plan[list[JSON]]:
        """Every approval request this client's user may decide, all pages followed."""
        items: list[JSON] = []
        params = {"status": status}
        while True:
            request = Request("GET", "/approvals", params=params)
            page = yield from answered(request, items=list, next_cursor=(str, type(None)))
            items += page["items"]
            if page["next_cursor"] is None:
                return items
            params = {"status": status, "cursor": page["next_cursor"]}

    @operation
    def catalog(self, format: Format = "raw", *, strict: bool = False) -> Plan[Catalog]:
        """The tools this client's user may use, shaped for a model API (``format``)."""
        params = {"format": format, **({"strict": "true"} if strict else {})}
        return cast(Catalog, (yield from answered(Request("GET", "/catalog", params=params))))

    @operation
    def start_run(
        self,
        task: str | None = None,
        *,
        limits: JSON | None = None,
        tools: list[str] | None = None,
        outside: Outside = "deny",
    ) -> Plan[Run]:
        """A new run (one agent task) with budgets; pass its ``run_id`` to the calls.
        ``tools``: its scope, the only tools it may call (chosen from the user's request,
        before the run reads any data); a call of another is refused, or with ``outside:
        "approve"`` needs an approval."""
        scope = {"tools": tools, "outside": outside} if tools is not None else None
        request = Request("POST", "/runs", body(task=task, limits=limits, scope=scope))
        return cast(Run, (yield from answered(request)))

    @operation
    def narrow_run(self, run_id: str, tools: list[str], outside: Outside = "deny") -> Plan[Run]:
        """Narrow a run's scope to ``tools`` (a subset of its scope; never wider)."""
        payload = {"scope": {"tools": tools, "outside": outside}}
        request = Request("PATCH", f"/runs/{quote(run_id, safe='')}", payload)
        return cast(Run, (yield from answered(request)))

    @operation
    def run(self, run_id: str) -> Plan[Run]:
        return cast(Run, (yield from answered(Request("GET", f"/runs/{quote(run_id, safe='')}"))))

    @operation
    def finish_run(self, run_id: str, status: RunEnd, reason: str | None = None) -> Plan[Run]:
        payload = body(status=status, reason=reason)
        request = Request("POST", f"/runs/{quote(run_id, safe='')}/finish", payload)
        return cast(Run, (yield from answered(request)))

    @operation
    def audit(
        self, *, limit: int = 100, cursor: str | None = None, **filters: Unpack[AuditFilters]
    ) -> Plan[Page]:
        """One page of the audit trail, oldest first (auditors and admins)."""
        params = {**query(filters), "limit": str(limit), **body(cursor=cursor)}
        return cast(Page, (yield from answered(Request("GET", "/audit", params=params))))

    @operation
    def audit_export(self, **filters: Unpack[AuditFilters]) -> Plan[list[JSON]]:
        """Every matching audit row, oldest first, read whole from the NDJSON export. Rows
        end at ``\n`` alone: JSON leaves U+2028 or U+0085 raw inside a string (in an argument
        any user sends), where ``splitlines`` would cut a row in two."""
        response = yield from answer(Request("GET", "/audit/export", params=query(filters)))
        try:
            rows = [json.loads(line) for line in response.content.split(b"\n") if line]
        except ValueError:
            raise _unexpected(response) from None
        if not all(isinstance(row, dict) for row in rows):
            raise _unexpected(response)
        return rows

    @operation
    def verify_audit(self) -> Plan[JSON]:
        """The server's check of the audit trail's hash chain (``ok``, ``first_broken``…)."""
        return (yield from answered(Request("GET", "/audit/verify")))


def query(filters: AuditFilters) -> dict[str, str]:
    return {name: str(value) for name, value in filters.items()}


def waiting(call: Call) -> bool:
    """The server's own rule: a call waits for a decision, its execution, or its preview."""
    state = call["state"]
    return state in ("awaiting_approval", "executing") or (
        state == "proposed" and call["proposal"].get("next") == "dry_run"
    )
