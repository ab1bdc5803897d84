"""Claiming due rows and handing them to workers.

A claim takes up to ``SCHEDULING_CLAIM_BATCH_SIZE`` due rows in one statement (``store``), groups
them by kind and fans them out as ``scheduling.run_batch`` messages of the kind's batch size: a
message per batch instead of per job is what lets a table outrun a message-per-job queue, and a
small batch size (1 for slow kinds) keeps a long job from holding up short ones. A wake-up (an
early claim at a near due time) runs its first batch in place, saving a hop.

Beat fires ``tick()`` every second; near-due rows also get a wake-up message with a countdown to
their due time, so lag is milliseconds rather than up to a tick. The row stays the truth: a
lost or early wake-up just finds nothing due, and the next tick catches up.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import defaultdict
from collections.abc import Sequence

from django.db import transaction

from scheduling import conf, registry, store, tasknames, wakeups

logger = logging.getLogger(__name__)

MAX_WAKE_HOPS = 3  # a wake-up that finds its rows not yet due (clock skew) re-arms at most this often


@dataclasses.dataclass(frozen=True)
class ClaimReport:
    claimed: int
    batches: int
    ran_inline: int
    more_due: bool


def batches_for(claims: Sequence[store.Claim]) -> list[list[tuple[int, str]]]:
    """Group claims by kind and cut each group into the kind's batch size."""
    by_kind: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for c in claims:
        by_kind[c.kind].append((c.id, c.token))
    out: list[list[tuple[int, str]]] = []
    for kind_name, items in by_kind.items():
        try:
            size = registry.get(kind_name).batch_size
        except registry.exceptions.UnknownJobKind:
            size = 1  # the run records the failure per job
        out.extend(items[i : i + size] for i in range(0, len(items), size))
    return out


def claim_and_dispatch(*, run_first_inline: bool, limit: int | None = None) -> ClaimReport:
    """Claim due rows and send them to workers; optionally run the first batch here."""
    from scheduling import runner, workers

    size = int(limit or conf.get("SCHEDULING_CLAIM_BATCH_SIZE"))
    queued = wakeups.queued_messages()
    if queued >= int(conf.get("SCHEDULING_MAX_QUEUED_BATCHES")):
        # Back-pressure: workers have enough waiting. Claiming more would only age claims in the
        # broker (their heartbeat starts when they run) until the sweeper takes them back.
        logger.debug("claim deferred: the queue is full", extra={"queued": queued, "action": "claim_deferred"})
        return ClaimReport(0, 0, 0, True)
    claims = store.claim_due_jobs(size)
    batches = batches_for(claims)
    inline: list[tuple[int, str]] = batches.pop(0) if (run_first_inline and batches) else []
    kind_of = {c.id: c.kind for c in claims}
    for batch in batches:
        workers.run_batch.apply_async(
            args=[batch],
            time_limit=runner.hard_time_limit(batch, claims),
            shadow=tasknames.batch(kind_of[batch[0][0]]),  # Flower shows the kind (a batch holds one)
        )
    more_due = len(claims) >= size
    if more_due:
        # A full claim means more rows are due: claim again now rather than at the next tick.
        workers.claim.apply_async(expires=30)
    if claims:
        logger.debug("claimed due jobs", extra={"claimed": len(claims), "batches": len(batches) + bool(inline)})
    if inline:
        runner.run_batch(inline)
    return ClaimReport(len(claims), len(batches) + (1 if inline else 0), len(inline), more_due)


def plan_wakes() -> int:
    """Send a wake-up for each distinct near due time (coalesced to the resolution); returns how many."""
    from scheduling import workers

    horizon = float(conf.get("SCHEDULING_WAKE_HORIZON_SECONDS"))
    resolution = float(conf.get("SCHEDULING_WAKE_RESOLUTION_MS")) / 1000
    upcoming = store.next_due_times(horizon, int(conf.get("SCHEDULING_MAX_WAKES_PER_TICK")))
    planned_at = time.monotonic()
    # Wake at the END of each resolution bucket: every row in it is due by then.
    buckets: dict[int, float] = {}
    for at, seconds in upcoming:
        bucket = math.ceil(at.timestamp() / resolution)
        buckets[bucket] = max(buckets.get(bucket, 0.0), seconds + (bucket * resolution - at.timestamp()))
    fresh = wakeups.mark_planned(sorted(buckets))  # ticks overlap: skip instants already planned
    for bucket in fresh:
        countdown = max(0.0, buckets[bucket] - (time.monotonic() - planned_at))
        workers.wake.apply_async(countdown=countdown, expires=countdown + 10)
    return len(fresh)


def tick() -> ClaimReport:
    """Beat's claim: claim and fan out what is due, then plan wake-ups for what is about to be."""
    report = claim_and_dispatch(run_first_inline=False)
    plan_wakes()
    return report


def wake(hops: int = 0) -> ClaimReport:
    """An early claim at a due time; re-arms briefly if the rows are not due yet by the database clock."""
    from scheduling import workers

    report = claim_and_dispatch(run_first_inline=True)
    if report.claimed == 0 and hops < MAX_WAKE_HOPS:
        soon = store.next_due_times(0.25, 1)
        if soon:
            countdown = max(0.0, soon[0][1])
            workers.wake.apply_async(kwargs={"hops": hops + 1}, countdown=countdown, expires=countdown + 10)
    return report


def wake_on_commit(in_seconds: float, asked_at: float) -> None:
    """After the caller's transaction commits, send a wake-up for a row due within the horizon."""
    horizon = float(conf.get("SCHEDULING_WAKE_HORIZON_SECONDS"))
    if in_seconds > horizon:
        return  # beat's tick plans it when it comes within the horizon

    def send() -> None:
        from scheduling import workers

        countdown = max(0.0, in_seconds - (time.monotonic() - asked_at))
        try:
            workers.wake.apply_async(countdown=countdown, expires=countdown + 10)
        except Exception:
            logger.warning("could not send a wake-up; the next claim tick will pick the job up", exc_info=True)

    transaction.on_commit(send)
