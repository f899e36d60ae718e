"""Resolving open execution records in the background, without waiting for a client.

Why: a record stays open (``in_flight`` or ``unknown``) when its worker could not learn or
store the provider's outcome: the provider timed out, the worker died mid-call, or the
database failed after the provider acted. The client was told the outcome is unknown and
may never retry, and until the record is resolved the audit trail says nothing of an action
that may have happened. A pass every ``EVERY_S`` asks the provider about such records.

- **Stale records only.** A record is taken once unchanged for longer than any provider's
  timeout plus the lock margin: a worker that is still alive has given up on its call by
  then. Each record is also taken under the same Redis lock a request on its key holds, so
  a pass never races a client's retry (a key being worked on is skipped).
- **Ask, never re-send.** An answer of the tool's ``reconcile`` endpoint finishes the record
  through the same code as a client's retry (``OpenExecution.ask``): the stored response is
  the one a replay returns, with its ``reconciled`` audit row. A stale ``in_flight`` record
  that gets no finished answer becomes ``unknown``, with its audit row. One the provider
  never saw (404), or whose tool has no reconcile endpoint, stays open for the client's
  retry, which re-sends with the same operation id: a send must be authorized by a request
  carrying the actor's token, re-checked from scratch (roles, ownership, egress), and must
  be wanted by a client still waiting for it; the background has neither. So it builds an
  ``OpenExecution``, which can ask and finish but has no way to send.
- **One pass at a time across instances.** A session advisory lock taken on a connection
  held for the pass and released explicitly at its end; that connection holds no
  transaction, and each record is written in short transactions of its own, so nothing is
  held open across a provider call. If the connection dies, PostgreSQL releases the lock.
- **Bounded.** At most ``BATCH`` records per pass, least recently changed first; a record
  left open is postponed by a whole stale period (its ``updated_at`` moves), so records no
  answer resolves do not starve the rest. So is one whose resolution fails unexpectedly:
  it is logged, and the pass goes on to the next.
"""

from __future__ import annotations

import asyncio
import logging
import time

from app.auth.principal import Principal
from app.calls import exactly_once, mutation, store
from app.calls.models import CallRow, ExecutionRow, Request
from app.calls.mutation import OpenExecution
from app.calls.policy import PreparedCall, Target
from app.calls.services import Services
from app.catalog.models import Catalog, Tool
from app.db import Lock
from app.errors import ProviderTimeout, Unavailable

EVERY_S = 10.0
BATCH = 20
log = logging.getLogger("toolgate")


async def run(state: Services) -> None:
    """A pass every ``EVERY_S`` for as long as the app runs; trouble postpones to the next."""
    while True:
        await asyncio.sleep(EVERY_S)
        try:
            looked_at = await reconcile_stale(state)
        except Unavailable as exc:
            log.warning("reconciliation postponed: %s", exc.detail)
        except Exception:
            log.exception("reconciliation pass failed; retrying on the next tick")
        else:
            if looked_at:
                log.info("reconciliation pass: %d stale execution records looked at", looked_at)


async def reconcile_stale(state: Services) -> int | None:
    """One pass: the number of stale records looked at, or ``None`` when another pass (on
    any instance) holds the lock."""
    catalog = state.catalog
    if not catalog.tools:
        return 0
    stale_s = max(tool.provider.timeout_s for tool in catalog.tools.values())
    stale_s += mutation.LOCK_MARGIN_S
    async with state.db.exclusively(Lock.RECONCILER) as held:
        if not held:
            return None
        async with state.db.connection() as conn:
            records = await store.stale_executions(conn, stale_s, BATCH)
        for record in records:
            try:
                await _resolve(state, catalog, record)
            except Unavailable:
                raise  # the database or locks: the pass stops, and the next one retries
            except Exception:
                log.exception("reconciling %s failed; postponed", record.operation_id)
                async with state.db.connection() as conn:
                    await store.postpone(conn, record.operation_id)
    return len(records)


async def _resolve(state: Services, catalog: Catalog, record: ExecutionRow) -> None:
    tool = catalog.tools.get(record.tool)
    if tool is None:  # gone from the catalog: nothing to ask, nor to mask its arguments by
        async with state.db.connection() as conn:
            await store.postpone(conn, record.operation_id)
        return
    key = mutation.lock_name(record.tenant, record.actor, record.idempotency_key)
    async with state.locks.hold(key, mutation.lock_ttl(tool)) as held:
        if not held:  # a request on this key is at work on it
            return
        async with state.db.connection() as conn:
            current = await store.get_execution(
                conn, record.tenant, record.actor, record.idempotency_key
            )
            call = await store.get(conn, record.call_id)
        if current is None or current.operation_id != record.operation_id or call is None:
            return
        if current.state in exactly_once.FINISHED:  # finished since the batch was read
            return
        opened = _opened(state, catalog, tool, current, call)
        try:
            if await opened.ask() is not None:
                return
        except ProviderTimeout:
            pass  # no usable answer
        if current.state == "in_flight":  # audited once; its updated_at moves with it
            await opened.mark_unknown()
        else:
            async with state.db.connection() as conn:
                await store.postpone(conn, current.operation_id)


def _opened(
    state: Services, catalog: Catalog, tool: Tool, record: ExecutionRow, call: CallRow
) -> OpenExecution:
    """The open record with the original request, as far as storing its outcome needs it:
    the record's actor and tenant (the identity the provider is told), its stored arguments,
    fingerprint, target and run. Nothing is re-authorized: nothing is sent but the
    reconcile query."""
    target = None
    if record.target_type is not None and record.target_id is not None:
        target = Target(record.target_type, record.target_id)
    arguments = call.arguments or {}
    principal = Principal(sub=record.actor, tenant=record.tenant, roles=frozenset())
    request = Request(
        principal,
        catalog,
        record.tool,
        tool,
        arguments,
        call.run_id,
        call.tool_call_id,
        time.perf_counter(),
    )
    prepared = PreparedCall(tool, arguments, record.fingerprint, target, (), ())
    return OpenExecution(state, request, prepared, record)
