"""The orphan duty: close fixed-time runs whose worker died without recording an outcome.

A run is admitted as ``running`` (``gate.py``) and its worker records the outcome. A worker that
dies first (``kill -9``, the OOM killer, a lost host) leaves the row ``running``. The gate closes
such rows only when a later run of the same schedule takes its overlap lock (``forbid``,
``replace``); an ``allow`` schedule has no lock, and a schedule that never runs again closes
nothing, so the row stayed ``running`` for ever, and history limits never prune running rows.

The worker leader's control loop calls ``duty()`` on its duties thread; every
``SCHEDULING_SWEEP_INTERVAL_SECONDS`` it reads the runs still marked running and closes as
``failed`` (``decide``), with the reason in ``error``:

- a run admitted under ``forbid`` or ``replace`` whose overlap lock nobody holds: its run would
  hold it (taken in the admitting transaction, released only after the outcome), so its process
  is gone;
- a run admitted under ``allow`` (no lock) older than its deadline as admitted (the schedule's
  ``active_deadline_seconds``, else its kind's timeout) plus ``SCHEDULING_LEASE_SECONDS``: the
  gate stops a live run at its deadline, so one still running a lease later has lost its worker.

What it was admitted under, not the schedule's policy now: an edit while a run goes (allow to
forbid, a shorter deadline) does not make it "lost".

The close is conditional on the row still being ``running``: an outcome recorded meanwhile wins.
Then the schedule's history limits apply to it as to any final run.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from django.db import DatabaseError

from scheduling.core import conf, exceptions, registry
from scheduling.fixed import gate, store
from scheduling.models import ConcurrencyPolicy

logger = logging.getLogger(__name__)

LOCK_GONE_ERROR = "the worker running it was lost (its overlap lock is free and it recorded no outcome)"
TOO_OLD_ERROR = "the worker running it was lost (no outcome {seconds:g}s after it started: its deadline plus the lease)"


def deadline_seconds(run: store.RunToCheck) -> float:
    """How long the gate lets the run go: its deadline as admitted, else the schedule's active deadline, else
    its kind's timeout."""
    if run.deadline_seconds:
        return float(run.deadline_seconds)
    if run.active_deadline_seconds:
        return float(run.active_deadline_seconds)
    try:
        return float(registry.get(run.kind).timeout_seconds)
    except exceptions.UnknownJobKind:
        return float(conf.get().default_timeout_seconds)


def decide(run: store.RunToCheck, lock_held: bool | None, grace_seconds: float) -> str | None:
    """The error to close ``run`` with, or None to leave it running.

    ``lock_held`` is whether the schedule's overlap lock is held (None for a run that holds none).
    A run is judged by what it was admitted under (``holds_lock``, ``deadline_seconds``), not by an
    edit made since: an allow run is not "lost" because the policy became forbid while it ran.
    """
    if holds_lock(run) and lock_held is not None:
        # Only the admitted run of a forbid or replace schedule holds its lock (admission closes
        # the others): held, that run is alive, however long it takes; free, its process is gone.
        return None if lock_held else LOCK_GONE_ERROR
    limit = deadline_seconds(run) + grace_seconds
    if run.age_seconds > limit:
        return TOO_OLD_ERROR.format(seconds=round(limit))
    return None


def holds_lock(run: store.RunToCheck) -> bool:
    """Whether the run was admitted holding the schedule's overlap lock (forbid or replace)."""
    if run.holds_lock is not None:
        return run.holds_lock
    return run.concurrency_policy != ConcurrencyPolicy.ALLOW


@dataclasses.dataclass(frozen=True)
class Report:
    checked: int
    closed: list[int]


def close_orphans() -> Report:
    """One pass: close every run left without its worker (see the module); the ids closed."""
    grace = float(conf.get().lease_seconds)
    runs = store.running_runs_to_check()
    closed: list[int] = []
    locks_seen: dict[int, bool] = {}
    for run in runs:
        lock_held: bool | None = None
        if holds_lock(run):
            if run.schedule_id not in locks_seen:
                locks_seen[run.schedule_id] = gate.is_running(run.schedule_id)
            lock_held = locks_seen[run.schedule_id]
        error = decide(run, lock_held, grace)
        if error is None or not store.close_orphan_run(run.id, error):
            continue
        closed.append(run.id)
        logger.warning(
            "closed a fixed-time run whose worker was lost",
            extra={"run_id": run.id, "schedule_id": run.schedule_id, "action": "closed_orphan", "error": error},
        )
        store.prune_schedule_runs(run.schedule_id, run.successful_history_limit, run.failed_history_limit)
    return Report(checked=len(runs), closed=closed)


class Duty:
    """``close_orphans`` as a control-loop duty: at most every ``SCHEDULING_SWEEP_INTERVAL_SECONDS``."""

    def __init__(self) -> None:
        self.closed = 0
        self._next_at = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next_at or not self._lock.acquire(blocking=False):
            return
        try:
            report = close_orphans()
        except DatabaseError:
            raise  # the duties thread resets its connection and tries again
        except Exception:
            # A bug here must not stop the other duties (claims and sweeps run on the loop's own thread).
            logger.exception("fixed-time orphan pass failed", extra={"action": "close_orphans_failed"})
            return
        finally:
            self._next_at = now + conf.get().sweep_interval_seconds
            self._lock.release()
        self.closed += len(report.closed)


duty = Duty()
