"""Sending the webhook outbox, on every instance, for as long as the app runs.

- **At least once.** A delivery is claimed by moving its ``next_at`` a lease ahead (one
  short statement, ``FOR UPDATE SKIP LOCKED``, so instances share the work), sent with no
  transaction open, then marked delivered or given a retry time. A sender that dies between
  the send and the mark leaves it to come due again when the lease runs out: the receiver
  may see it twice, with the same ``webhook-id``.
- **Only to the catalog's URLs.** Each delivery is sent only if the current catalog still
  names its URL for its event, signed with that entry's current secret; otherwise it is put
  off like a failed one, and dropped (and logged) once its event is ``DROP_AFTER_S`` old.
  Instances reload their catalogs one at a time: an event queued by an instance whose
  catalog names a new endpoint is often claimed by one that does not name it yet.
- **Each endpoint on its own.** A delivery is sent in a task of its own, and the next pass
  does not wait for it: it only leaves out the URLs this process is still sending to. An
  endpoint that never answers holds its own deliveries for the timeout, not everyone's (and
  this process sends to it at most ``BATCH`` at a time).
- **Backoff.** A refused or failed delivery is retried after ``BACKOFF_S`` doubled per
  attempt, capped at ``MAX_BACKOFF_S``, with jitter so endpoints coming back are not hit by
  every instance at once. Redirects are not followed: a 3xx is a failure.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import orjson

from app.errors import Unavailable
from app.outbound import NotSent, Uncertain, site
from app.state import AppState
from app.webhooks import signing, store
from app.webhooks.store import Delivery

EVERY_S = 1.0
BATCH = 20
TIMEOUT_S = 10.0
LEASE_S = TIMEOUT_S * 3
BACKOFF_S = 5.0
MAX_BACKOFF_S = 3600.0
DROP_AFTER_S = 3600.0
NOT_NAMED = "the catalog of the instance that claimed it does not name its URL for its event"
log = logging.getLogger("toolgate")


async def run(state: AppState) -> None:
    """A pass every ``EVERY_S``; database trouble postpones to the next. The sends still
    under way when the app stops are cancelled: their deliveries come due again when their
    lease runs out."""
    sending: dict[asyncio.Task[None], str] = {}
    try:
        while True:
            await asyncio.sleep(EVERY_S)
            try:
                await send_due(state, sending)
            except Unavailable as exc:
                log.warning("webhook deliveries postponed: %s", exc.detail)
            except Exception:
                log.exception("webhook pass failed; retrying on the next tick")
    finally:
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)


async def send_due(state: AppState, sending: dict[asyncio.Task[None], str]) -> int:
    """One pass: start sending the due deliveries to URLs not in ``sending`` (this process's
    sends under way, by their URL), and add them to it; the number started."""
    async with state.db.connection() as conn:
        deliveries = await store.claim(conn, BATCH, LEASE_S, set(sending.values()))
    for delivery in deliveries:
        task = asyncio.create_task(_send(state, delivery))
        sending[task] = delivery.url
        task.add_done_callback(lambda done: sending.pop(done, None))
    return len(deliveries)


async def _send(state: AppState, delivery: Delivery) -> None:
    """Send ``delivery`` and record how it went; trouble is logged here, as no one awaits
    this task."""
    try:
        await _attempt(state, delivery)
    except Unavailable as exc:
        log.warning("webhook %s not recorded: %s", delivery.id, exc.detail)
    except Exception:
        log.exception("webhook %s failed; it comes due again after its lease", delivery.id)


async def _attempt(state: AppState, delivery: Delivery) -> None:
    webhook = next(
        (w for w in state.catalog.webhooks if w.url == delivery.url and delivery.event in w.events),
        None,
    )
    if webhook is None:
        async with state.db.connection() as conn:
            if not await store.drop(conn, delivery.id, DROP_AFTER_S):
                await store.retry(conn, delivery.id, backoff(delivery.attempts), NOT_NAMED)
                return
        log.warning(
            "webhook %s dropped: the catalog no longer sends %s to %s",
            delivery.id,
            delivery.event,
            site(delivery.url),
        )
        return
    body = orjson.dumps(delivery.payload)
    headers = signing.headers(webhook.secret, delivery.id, int(time.time()), body)
    try:
        response = await state.outbound.request(
            "POST",
            delivery.url,
            timeout_s=TIMEOUT_S,
            headers=headers,
            json=delivery.payload,  # serialized as ``body`` was: the bytes signed
            status_only=True,  # a 2xx delivers, whatever page the receiver answers with
        )
        error = None if 200 <= response.status < 300 else f"answered {response.status}"
    except (NotSent, Uncertain) as exc:
        error = str(exc)[:500]
    async with state.db.connection() as conn:
        if error is None:
            await store.delivered(conn, delivery.id)
        else:
            await store.retry(conn, delivery.id, backoff(delivery.attempts), error)
            # The delivery's id leads to the whole URL in the outbox.
            log.info("webhook %s to %s failed: %s", delivery.id, site(delivery.url), error)


def backoff(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: doubling, capped, and
    jittered down by up to half."""
    delay: float = min(MAX_BACKOFF_S, BACKOFF_S * 2.0 ** min(attempts - 1, 30))
    return delay * random.uniform(0.5, 1.0)
