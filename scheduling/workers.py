"""Timekeeper's Celery tasks: thin wrappers that call the modules holding the decisions.

- ``scheduling.claim``: beat's tick (every second): claim due rows, fan out, plan wake-ups.
- ``scheduling.wake``: an early claim at a near due time (countdown message).
- ``scheduling.run_batch``: run a batch of claimed jobs.
- ``scheduling.sweep``: take back dead claims, prune history.
- ``scheduling.run_fixed``: one tick of a fixed-time schedule, through the gate (``fixed``).

Claim-type messages expire quickly: a tick that waited in the queue longer than that is useless,
the next one is coming. Run messages never expire; if lost, their rows are swept back.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from celery import Task, shared_task

from scheduling import claim as claim_module
from scheduling import fixed, runner
from scheduling import sweep as sweep_module

logger = logging.getLogger(__name__)


@shared_task(name="scheduling.claim", ignore_result=True, acks_late=False)
def claim() -> dict[str, Any]:
    """Claim what is due and hand it to workers."""
    report = claim_module.tick()
    return {"claimed": report.claimed, "batches": report.batches}


@shared_task(name="scheduling.wake", ignore_result=True, acks_late=False)
def wake(hops: int = 0) -> dict[str, Any]:
    """Claim at a due time, running the first batch here."""
    report = claim_module.wake(hops)
    return {"claimed": report.claimed, "ran_inline": report.ran_inline}


@shared_task(name="scheduling.run_batch", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run_batch(claims: list[list[Any]]) -> dict[str, Any]:
    """Run a batch of claimed jobs, each given as [id, token]."""
    report = runner.run_batch([(int(c[0]), str(c[1])) for c in claims])
    return {"started": report.started, "succeeded": report.succeeded, "failed": report.failed}


@shared_task(name="scheduling.sweep", ignore_result=True, acks_late=False)
def sweep() -> dict[str, Any]:
    """Take back claims of dead workers and prune finished history."""
    report = sweep_module.sweep()
    return {"reclaimed": report.reclaimed, "killed": report.killed, "pruned": report.pruned}


@shared_task(name="scheduling.run_fixed", bind=True, ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run_fixed(self: Task, schedule: str, tick: str | None = None, trigger: str = "beat") -> dict[str, Any]:
    """Run one tick of a fixed-time schedule; a redelivered or repeated tick is refused by the gate's ledger.

    Without a tick (a periodic task sent by hand, e.g. django-celery-beat's "run" action) it is a
    manual run whose tick is the database clock now.
    """
    when = dt.datetime.fromisoformat(tick) if tick else None
    if tick is None:
        trigger = "manual"
    report = fixed.run(schedule, when, trigger, task_id=str(self.request.id or ""))
    return {"outcome": report.outcome, "run_id": report.run_id, "attempt": report.attempt}
