"""Claiming due rows and handing them to workers, never more than the queue has room for.

A claim takes due rows in one statement (``store.claim_due_jobs``: ``FOR UPDATE SKIP LOCKED``),
groups them by kind and sends each group as ``scheduling.run_batch`` messages of the kind's batch
size (ids and tokens only): a message per batch instead of per job is what lets a table outrun a
message-per-job queue, and a small batch size (1 for slow kinds) keeps a long job from holding up
short ones. A job whose batch died with its process is sent alone from then on (``run_alone``,
set by the sweeper), so a poison job cannot take its siblings with it again. Batches are sent
most urgent first (highest priority, then earliest due): the queue is FIFO, so that is the order
in which they start.

Back-pressure is a hard bound: the job queue never holds more than
``SCHEDULING_MAX_QUEUED_BATCHES`` messages sent by the claim. Each claim is sized to the room left:
at most (room x the default batch size) rows, and only as many whole batches as there is room
for, cut per kind by the statement itself, so a kind with small batches is claimed one batch per
free message. Claims the broker refused are given back at once (``store.unclaim_jobs``), as if
never taken. So at every moment of a burst at most (bound x batch size) rows are claimed and not
started, and each waits at most for the messages ahead of it. A claimed row's lease starts when its batch
starts (``store.start_jobs``); until then the sweeper leaves it alone while its message is still
in the queue or held by a worker (``holdings.claim_ids_in_flight``). The control loop refills a queue once it has room
for half its bound (``refill_room``), not after each batch a worker takes: a claim of two batches
costs about what one of one does (the statement's planning, the rooms read from Redis, the turn),
and the batches still queued keep the workers busy meanwhile. Its claims of rate-limited kinds
(on their own cadence) take any room while such a kind has due jobs waiting (``control``).

Who claims: the control loop (``due_at.control``), one per cluster. ``wake_on_commit`` lets it know,
by a NOTIFY sent when the caller's transaction commits, that a row is due soon.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import kombu.exceptions
import redis

from scheduling.core import broker, conf, exceptions, holdings, registry, tasknames, tracing
from scheduling.core import store as core_store
from scheduling.due_at import store

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "timekeeper_due"
HARD_LIMIT_MARGIN_SECONDS = 30  # Celery kills a batch this long after the sum of its jobs' timeouts
ARGSREPR_LIMIT = 1024  # characters of a batch message's arguments shown by Flower (Celery's own limit)
REFILL_SHARE = 0.5  # the control loop claims for a queue once this share of its bound is free (at least 1 batch)


@dataclasses.dataclass(frozen=True)
class ClaimReport:
    """What one claim did: rows claimed and sent, messages sent, rows given back, whether more are due."""

    claimed: int
    batches: int
    given_back: int
    more_due: bool  # the claim was full (or the queue had no room): claim again soon
    queue_full: bool = False  # nothing was claimed because the queue had no room
    send_failed: bool = False  # the broker refused a send: the claims were given back (control steps down after a few)


def batch_sizes() -> dict[str, int]:
    """Every registered kind's batch size, for the claim statement to cut batches (a kind not in it: 1)."""
    return {name: kind.batch_size for name, kind in registry.all_kinds().items()}


def batches_for(claims: Sequence[store.Claim]) -> list[list[store.Claim]]:
    """The batches the claim statement cut (``Claim.batch``), most urgent batch first, rows in claim order.

    The statement is the one place batches are cut (per kind, the kind's batch size each, a
    ``run_alone`` claim alone; ``batch_sizes()`` gives it the sizes): here they are only grouped.
    """
    by_batch: dict[int, list[store.Claim]] = {}
    for c in claims:
        by_batch.setdefault(c.batch, []).append(c)
    return sorted(by_batch.values(), key=lambda batch: batch[0].batch)


def hard_time_limit(batch: Sequence[store.Claim]) -> float | None:
    """Celery's hard limit for a batch message: the sum of its jobs' timeouts plus a margin.

    Each job counts with its own timeout when it was scheduled with one (``schedule(timeout=...)``),
    else with its kind's: a job given a longer timeout than its kind's lengthens its batch's limit,
    so Celery never kills a batch while one of its jobs is within its own timeout.

    None (no limit from the message) for a kind this process does not know, or one without a
    timeout: in a rolling deploy, the leader may be of the old release and the worker of the new
    one, and a limit guessed here could kill a job within its real timeout. The worker that runs it
    holds its timeout (``executor.deadline``) and its chunk's bound; one that does not know the kind
    gives the claim back (``runner``).
    """
    try:
        per_job = registry.get(batch[0].kind).timeout_seconds
    except exceptions.UnknownJobKind:
        return None
    timeouts = [per_job if c.timeout_seconds is None else c.timeout_seconds for c in batch]
    if not all(timeouts):
        return None
    return sum(timeouts) + HARD_LIMIT_MARGIN_SECONDS


_synced_rates: tuple[Any, ...] | None = None  # the registered rates last written (sync_rates)
_synced_at = 0.0  # when (time.monotonic()); written again every RATE_SYNC_SECONDS
RATE_SYNC_SECONDS = 60.0  # the registered rates are written again this often (a restored or new database)


def sync_rates(force: bool = False) -> None:
    """Write the handlers' registered rates (``handler(rate=...)``) to their kinds' control rows, once per change.

    The claim reads rates from the control rows only (an operator's ``api.set_rate`` wins over the
    registered one). Called by the claim; ``force`` writes again (a new leader, a test database).
    """
    global _synced_rates, _synced_at
    kinds = registry.all_kinds()
    rates = {
        name: (kind.rate.limit, float(kind.rate.per_seconds), kind.rate.partition_by)
        for name, kind in sorted(kinds.items())
        if kind.rate is not None
    }
    signature = (tuple(rates.items()), tuple(sorted(kinds)))
    if signature == _synced_rates and not force and time.monotonic() < _synced_at + RATE_SYNC_SECONDS:
        return
    store.sync_code_rates(rates, sorted(kinds))
    _synced_rates, _synced_at = signature, time.monotonic()


def refill_room() -> int:
    """The room (batches) a queue needs before the control loop claims for it: ``REFILL_SHARE`` of the bound, >= 1."""
    return max(1, math.ceil(conf.get().max_queued_batches * REFILL_SHARE))


def kind_queues() -> dict[str, str]:
    """Every registered kind's named queue ("default" unless it names one)."""
    return {name: kind.queue for name, kind in registry.all_kinds().items()}


def celery_queue(queue: str) -> str:
    """The Celery queue a named queue's batches are sent to: its own name, or for the "default" named queue
    the run message's routed queue (Celery's default queue unless ``CELERY_TASK_ROUTES`` routes it)."""
    return registry.celery_queue(queue, broker.routed_queue(tasknames.RUN_BATCH))


def queue_rooms(queues: Sequence[str]) -> dict[str, int]:
    """Each named queue's room: the batches its Celery queue may still hold, 0 when no live worker serves it.

    Back-pressure per queue: a queue nobody consumes would fill to the bound and keep its claims
    waiting there, so it takes nothing at all while no live worker says it serves it
    (``holdings.live_queues``). When Redis cannot say who serves what, only the lengths count.
    """
    return _queue_rooms(_routes(queues))[0]


def _routes(queues: Sequence[str]) -> dict[str, str]:
    """Each named queue (and the default one) with the Celery queue its batches go to: routed once a claim."""
    return {queue: celery_queue(queue) for queue in sorted(set(queues) | {registry.DEFAULT_QUEUE})}


def _queue_rooms(routes: dict[str, str]) -> tuple[dict[str, int], set[str]]:
    """``queue_rooms`` and the queues whose room is 0 because they are full (not because they are unserved).

    Who serves what and the queues' lengths come in one Redis round trip (``holdings.live_queues_and_lengths``).
    """
    bound = conf.get().max_queued_batches
    names = sorted(set(routes.values()))
    keys = {name: broker.queue_keys([name]) for name in names}
    try:
        live, lengths = holdings.live_queues_and_lengths([key for name in names for key in keys[name]])
    except redis.RedisError:
        logger.warning("cannot read the queues' lengths; claiming as if they were empty", exc_info=True)
        live, lengths = None, [0] * sum(len(k) for k in keys.values())
    queued, at = {}, 0
    for name in names:
        queued[name], at = sum(lengths[at : at + len(keys[name])]), at + len(keys[name])
    rooms, full = {}, set()
    for queue, name in routes.items():
        if live is not None and live and not live.get(name):
            rooms[queue] = 0
        else:
            rooms[queue] = max(0, bound - queued[name])
            if rooms[queue] <= 0:
                full.add(queue)
    return rooms, full


def claim_here(limit: int) -> list[store.Claim]:
    """Claim up to ``limit`` due rows to run in this process, sending nothing (``scheduling.testing.run_due``)."""
    sync_rates(force=True)  # the eager path (tests, run_due): its database may be new
    return store.claim_due_jobs(limit)


def claim_and_dispatch(
    limit: int | None = None, *, min_room: int = 1, rates: bool = True, session: Any = None
) -> ClaimReport:
    """Claim due rows, at most what the queue has room for, and send them to workers as batches.

    ``min_room``: a queue with room for fewer batches than this (but some) is left out of this
    claim as if it were full (``queue_full``); the control loop passes ``refill_room()``, or 1 on
    its turns of the rate-limited kinds while one has due jobs waiting.
    ``rates`` false: the rate-limited kinds take nothing in this claim (the control loop claims them
    on their own cadence, and other kinds' due times in between cost a claim without them).
    ``session``: the dedicated session to claim in (the control loop's leadership session, where
    the claim is prepared, not planned per claim: ``store.claim_due_jobs``); None: Django's connection.
    """
    with tracing.span("timekeeper.claim", mechanism=registry.Mechanism.DUE_AT) as span:
        report = _claim_and_dispatch(limit, min_room, rates, session, span)
        span.set("claimed", report.claimed)
        span.set("batches", report.batches)
        span.set("given_back", report.given_back)
        return report


def _claim_and_dispatch(
    limit: int | None, min_room: int, rates: bool, session: Any, span: tracing.Handle
) -> ClaimReport:
    settings = conf.get()
    queues = kind_queues()
    routes = _routes(list(queues.values()))
    rooms, filled = _queue_rooms(routes)
    if min_room > 1:
        # a queue not yet down to its refill mark waits: the batches it holds keep its workers busy
        filling = {queue for queue, free_batches in rooms.items() if 0 < free_batches < min_room}
        rooms = {queue: 0 if queue in filling else free_batches for queue, free_batches in rooms.items()}
        filled |= filling
    free = sum(rooms.values())
    full = bool(filled)  # a queue full by its length (an unserved one is not: nothing will empty it)
    if free <= 0:
        logger.debug("claim deferred: every queue is full", extra={"action": "claim_deferred"})
        return ClaimReport(0, 0, 0, more_due=True, queue_full=full)
    size = min(limit or settings.claim_batch_size, free * settings.default_batch_size)
    sync_rates()
    claims = store.claim_due_jobs(
        size,
        messages=free,
        batch_sizes=batch_sizes(),
        kind_queues=queues,
        queue_rooms=rooms,
        rates=rates,
        session=session,
    )
    span.set("job_ids", [c.id for c in claims])
    span.set("kinds", sorted({c.kind for c in claims}))
    batches = batches_for(claims)
    sent = 0
    send_failed = False
    try:
        for batch in batches[:free]:
            args = [[[c.id, c.token] for c in batch]]
            broker.send(
                tasknames.RUN_BATCH,
                args=args,
                # what Flower shows as the message's arguments, written here: Celery's own (saferepr of
                # 50 claims) cost 0.57 ms a message, a quarter of the leader's time per batch sent
                argsrepr=repr(args)[:ARGSREPR_LIMIT],
                time_limit=hard_time_limit(batch),
                queue=routes[queues.get(batch[0].kind, registry.DEFAULT_QUEUE)],
                shadow=tasknames.batch(batch[0].kind),  # Flower shows batch:<kind> (a batch holds one)
                retry_policy=broker.LEADER_SEND_RETRY_POLICY,
            )
            sent += 1
    except kombu.exceptions.OperationalError:
        logger.warning("cannot send batches: the broker is unreachable; claims given back", exc_info=True)
        send_failed = True
    unsent = [(c.id, c.token) for batch in batches[sent:] for c in batch]
    given_back = len(store.unclaim_jobs(unsent)) if unsent else 0
    if claims:
        logger.debug(
            "claimed due jobs",
            extra={"claimed": len(claims), "batches": sent, "given_back": given_back, "action": "claimed"},
        )
    # More may be due when the claim took all the rows, or all the messages a queue had room for.
    per_queue: dict[str, int] = {}
    for batch in batches:
        name = queues.get(batch[0].kind, registry.DEFAULT_QUEUE)
        per_queue[name] = per_queue.get(name, 0) + 1
    more_due = len(claims) >= size or any(n >= rooms.get(name, free) for name, n in per_queue.items())
    return ClaimReport(
        len(claims) - given_back,
        sent,
        given_back,
        more_due=more_due,
        queue_full=full and not claims,
        send_failed=send_failed,
    )


def wake_on_commit(in_seconds: float) -> None:
    """Tell the control loop, when the caller's transaction commits, that a row is due within its interval.

    NOTIFY is transactional: sent only if the transaction commits, so a rolled-back job wakes no one.
    Rows due later need no signal: the loop reads the next due time each time it goes to sleep.
    """
    if in_seconds > conf.get().claim_interval_seconds:
        return
    core_store.notify_due(NOTIFY_CHANNEL)
