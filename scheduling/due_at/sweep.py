"""The sweeper: take back claims whose worker died, and prune old history.

Run by the control loop (``due_at.control``) every ``SCHEDULING_SWEEP_INTERVAL_SECONDS``, beside the
claim and never behind jobs in a queue. A started claim is dead when its heartbeat is older than
its lease; a claim never started is dead when it is older than its lease and its message is
neither waiting in a queue it may be routed to nor held by a worker (lost with the broker:
``core.holdings.claim_ids_in_flight``) at two sweeps in a row. One look is not enough: a worker
takes a message in two steps (kombu's ``BRPOP`` off the queue, then a second command that records
it in ``unacked``), and a look between them finds it nowhere. Each turn locks a bounded batch (``SKIP LOCKED``,
``LIMIT``), lets ``due_at.lifecycle`` decide each job's fate and writes it with the one transition
statement, and commits on its own, so no lock is held for long however much there is to do; the
loop stops when a batch comes back short.

Crash isolation: a started claim taken back is due again after its kind's backoff, not at once.
When several jobs of one batch died with their process, none of them is charged the attempt (it
is recorded, and max_attempts grows by one) and each is flagged ``run_alone``: the claim sends it
in a batch of its own from then on, so the next crash is charged to the job that causes it. A
poison job reaches dead by itself; its siblings finish with their budget intact.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from scheduling.core import conf, holdings, registry, tasknames
from scheduling.due_at import lease, store
from scheduling.models import JobState

logger = logging.getLogger(__name__)

RECLAIM_BATCH_SIZE = 200  # claims taken back per statement: ~20-40 ms each, under 100 ms (bench sweep)
# Claims never started whose message was missing, remembered for the next sweep: each is passed back
# in every lock statement of that sweep (a 38-byte literal, ~2 ms of parsing a thousand).
UNSEEN_LIMIT = 5_000
UNSEEN_MAX_AGE = 3  # sweep intervals: an older look confirms nothing (this process did not lead meanwhile)
UNSEEN_MAX_AGE_FLOOR_SECONDS = 10.0  # ... and never less than this: a sweep every turn still confirms


@dataclasses.dataclass
class _Look:
    """The tokens of the claims never started whose message the last sweep did not find, and when it looked."""

    tokens: frozenset[str] = frozenset()
    at: float = -math.inf  # time.monotonic()


# The next sweep takes back those still missing. One caller per process: the control loop, whose
# leader sweeps (a `celery call scheduling.sweep` in a pool process looks once and takes back no
# claim never started). A look older than UNSEEN_MAX_AGE intervals (at least
# UNSEEN_MAX_AGE_FLOOR_SECONDS) is forgotten: a process that leads again, or a new leader, takes back
# no claim never started at its first sweep.
_last_look = _Look()


@dataclasses.dataclass(frozen=True)
class SweepReport:
    reclaimed: int  # back to pending
    killed: int  # attempts spent: dead
    pruned: int  # finished jobs deleted (with their attempts)


def reclaim_expired() -> tuple[int, int]:
    """Return stranded claims to pending (or dead); (reclaimed, killed).

    A claim never started is taken back when its message was missing at the previous call too.
    """
    reclaimed = killed = 0
    # waiting in a queue (every named queue's Celery queue and the routed one: broker.task_queues), or held by a worker
    queued = holdings.claim_ids_in_flight(tasknames.RUN_BATCH)
    global _last_look
    max_age = max(UNSEEN_MAX_AGE * conf.get().sweep_interval_seconds, UNSEEN_MAX_AGE_FLOOR_SECONDS)
    fresh = time.monotonic() - _last_look.at <= max_age
    confirmed = _last_look.tokens if queued is not None and fresh else frozenset()
    default = registry.Backoff()
    backoffs = {
        name: (kind.backoff.base_seconds, kind.backoff.cap_seconds) for name, kind in registry.all_kinds().items()
    }
    shared: set[str] = set()  # batches found shared: a batch cut by one statement's LIMIT stays shared
    while True:
        moved = store.sweep_expired_claims(
            heartbeats=lease.enabled(),
            sweep_after_seconds=conf.get().sweep_after_seconds,
            limit=RECLAIM_BATCH_SIZE,
            queued_ids=queued,
            confirmed=confirmed,
            backoffs=backoffs,
            default_backoff=(default.base_seconds, default.cap_seconds),
            shared_batches=shared,
        )
        shared.update(job.batch for job in moved if job.refunded)
        for job in moved:
            action = "dead" if job.state == JobState.DEAD else "refunded" if job.refunded else "reclaimed"
            logger.warning(
                "claim expired; job taken back (its batch died together: runs alone next, attempt not counted)"
                if job.refunded
                else "claim expired; job taken back",
                extra={"job_id": job.id, "action": action},
            )
        reclaimed += sum(1 for job in moved if job.state == JobState.PENDING)
        killed += sum(1 for job in moved if job.state == JobState.DEAD)
        if len(moved) < RECLAIM_BATCH_SIZE:
            break
    if queued is None:  # the broker did not answer: nothing seen missing
        _last_look = _Look()
    else:  # remember what it did not hold, for the next sweep to confirm
        _last_look = _Look(frozenset(store.unseen_unstarted_claims(queued, UNSEEN_LIMIT)), time.monotonic())
    return reclaimed, killed


def prune(max_batches: int = 1000) -> int:
    """Delete finished jobs (and their attempts) older than the retention, a batch at a time."""
    total, _ = _prune(max_batches=max_batches, seconds=None)
    if total:
        logger.info("pruned finished jobs", extra={"pruned": total, "action": "pruned"})
    return total


def prune_slice(seconds: float) -> tuple[int, bool]:
    """Prune for about ``seconds`` (at least one statement); (deleted, more left).

    The control loop's way: a slice per turn, so a claim due meanwhile waits one slice at most,
    not the whole backlog of history (``python -m bench soak`` measures the start lag this protects).
    """
    total, more = _prune(max_batches=None, seconds=seconds)
    if total:
        logger.debug("pruned finished jobs", extra={"pruned": total, "action": "pruned"})
    return total, more


def _prune(*, max_batches: int | None, seconds: float | None) -> tuple[int, bool]:
    days = conf.get().retention_days
    limit = conf.get().prune_batch_size
    stop_at = None if seconds is None else time.monotonic() + seconds
    total = statements = 0
    while True:
        deleted = store.prune_finished_jobs(days=days, limit=limit)
        total += deleted
        statements += 1
        if deleted < limit:
            return total, False
        if (max_batches is not None and statements >= max_batches) or (
            stop_at is not None and time.monotonic() >= stop_at
        ):
            return total, True


def sweep() -> SweepReport:
    reclaimed, killed = reclaim_expired()
    return SweepReport(reclaimed=reclaimed, killed=killed, pruned=prune())
