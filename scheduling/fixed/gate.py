"""The gate every fixed-time run goes through: ledger, overlap policy, deadline, timeout, outcome.

``run(schedule, tick, trigger)`` is what the ``scheduling.run_fixed`` Celery task calls, for
beat's ticks, catch-up ticks and "run now" alike:

1. **Ledger.** Insert the ``ScheduleRun`` (schedule, tick) as ``running``. The unique constraint
   admits the first delivery of a tick; a duplicate (a second beat during a handover, a
   redelivered message, a re-sent tick) is refused there, counted in ``duplicates_refused`` and
   logged, and never runs. A tick whose row was pruned is refused by the ``pruned_through`` mark.
2. **Paused kind.** A tick of a schedule whose kind is paused (``api.pause``, the switch that keeps
   its due_at jobs pending) is recorded as ``skipped`` with the reason and not run, whatever its
   trigger (a "run now" of a paused kind waits for nothing: it is skipped too, as it says).
3. **Starting deadline.** A tick older than ``starting_deadline_seconds`` by the *database* clock
   is recorded as ``missed`` and not run ("run now" has no deadline).
4. **Overlap.** ``pg_try_advisory_lock`` keyed on the schedule, on a dedicated connection
   (``locks.AdvisoryLock``), held for the whole run and released in ``finally``; a crashed worker
   releases it with its connection. ``forbid``: lock busy -> ``skipped``. ``replace``: revoke the
   running run's Celery task (``terminate=True``), wait up to ``SCHEDULING_FIXED_REPLACE_WAIT_SECONDS``
   for its lock, mark it ``replaced``. ``allow``: no lock.
5. **Run** the registered handler with ``mechanism="fixed"`` under ``active_deadline_seconds``
   (the kind's timeout when unset) for the whole run, retries included -> ``timed_out``;
   ``backoff_limit`` retries within the tick with the kind's backoff; then ``succeeded``/``failed``.
6. **Prune** the history to the schedule's limits.

An operator may abort the running run (``abort_run``, ``api.abort_schedule_run``, the admin's run
list): a watcher thread reads the request every heartbeat interval and the handler is interrupted
as a timeout is (``core/aborts.py``); the run is recorded ``aborted`` with who asked and when.

Why both a ledger and a lock: the lock alone only says "nobody is running this schedule right
now". A run that finishes quickly releases it, and a second delivery of the same tick (the other
beat replica's message, a redelivery after a lost ack) then finds it free and runs the tick again.
The ledger alone would stop that, but says nothing about a run of the *previous* tick still
going, and cannot tell a crashed run (whose row says ``running`` forever) from a live one, while
the lock dies with its holder's connection. The ledger answers "was this tick run?", the lock
"is a run going?".
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from celery import current_app
from django.db import DatabaseError, connection, transaction
from django_celery_beat.models import PeriodicTask

from scheduling.core import (
    aborts,
    audit,
    conf,
    exceptions,
    executor,
    leadership,
    locks,
    registry,
    tasknames,
    validation,
)
from scheduling.core import store as core_store
from scheduling.fixed import messages, store
from scheduling.models import AttemptOutcome, ConcurrencyPolicy, RunState, RunTrigger, SchedulePolicy, ScheduleRun

logger = logging.getLogger(__name__)

LOCK_NAMESPACE = "schedule"
LOCK_POLL_SECONDS = 0.2  # replace: how often the new run tries the stopped run's lock


@dataclasses.dataclass(frozen=True)
class RunReport:
    """How one delivery of a tick ended at the gate."""

    outcome: str  # a RunState value; "refused" for a duplicate; "closed" if the row was closed meanwhile
    run_id: int | None
    tick: dt.datetime | None
    attempt: int = 0


def lock_for(policy_id: int) -> locks.AdvisoryLock:
    """The advisory lock that guards the overlap of one schedule's runs."""
    return locks.AdvisoryLock(LOCK_NAMESPACE, str(policy_id))


def is_running(policy_id: int) -> bool:
    """Whether some session holds the schedule's lock (a run is going)."""
    return locks.is_locked(LOCK_NAMESPACE, str(policy_id))


def find(schedule: str) -> SchedulePolicy:
    """The policy of the fixed-time schedule named ``schedule``, or ``ScheduleNotFound``."""
    policy = SchedulePolicy.objects.select_related("periodic_task").filter(periodic_task__name=schedule).first()
    if policy is None:
        raise exceptions.ScheduleNotFound(schedule)
    return policy


def run(
    schedule: str,
    tick: dt.datetime | None,
    trigger: str = RunTrigger.BEAT,
    task_id: str = "",
    policy_id: int | None = None,
) -> RunReport:
    """Run one tick of ``schedule`` through the gate (see the module docstring).

    ``policy_id`` is the policy row a signed message names (``messages``), and the row it runs
    under: a schedule renamed while its tick waited in the queue still runs it (found by name, the
    tick was lost with no row); one signed for a schedule since deleted (declared again under the
    same name or not) is refused and counted like a bad signature, so it cannot run again against
    a new row's empty ledger.
    """
    if policy_id is None:
        policy = find(schedule)
    else:
        found = SchedulePolicy.objects.select_related("periodic_task").filter(pk=policy_id).first()
        if found is None:
            messages.refuse(schedule, "its schedule was deleted after it was sent")
            return RunReport(messages.REFUSED, None, tick)
        policy, schedule = found, found.periodic_task.name  # renamed meanwhile: its current name from here on
    log: dict[str, Any] = {"schedule": schedule, "trigger": trigger}
    lock = lock_for(policy.pk) if policy.concurrency_policy != ConcurrencyPolicy.ALLOW else None
    try:
        # Admission is one transaction: the ledger row becomes visible as 'running' only together
        # with the lock being held (or as skipped/missed/refused, never half-way). So a run that
        # holds the lock may close every other 'running' row of the schedule as orphaned: none of
        # them can be a run that was admitted but has not tried the lock yet.
        with transaction.atomic():
            admitted = _admit(policy, lock, tick, trigger, task_id, log)
        if isinstance(admitted, RunReport):
            return admitted
        entry, kind = admitted
        state, error, attempt = _execute(policy, kind, entry, log)
        return _finish(policy, entry, state, error, attempt, log)
    finally:
        if lock is not None:
            lock.release()


def _admit(
    policy: SchedulePolicy,
    lock: locks.AdvisoryLock | None,
    tick: dt.datetime | None,
    trigger: str,
    task_id: str,
    log: dict[str, Any],
) -> RunReport | tuple[store.LedgerEntry, registry.Kind]:
    """Ledger, deadline, kind and overlap: a report when the tick does not run, else what to run."""
    entry = store.insert_schedule_run(
        policy.pk,
        tick,
        trigger,
        leadership.process_name(),
        task_id,
        holds_lock=lock is not None,
        deadline_seconds=_deadline_seconds(policy),
    )
    if entry is None:
        logger.warning(
            "tick refused: it is at or before the schedule's pruned history: a copy of a tick that ran or was "
            "recorded, or a first delivery that came after newer ticks ran and their history passed it; not run",
            extra={**log, "tick": tick.isoformat() if tick else None, "action": "refused_pruned"},
        )
        return RunReport("refused", None, tick)
    log["tick"] = entry.tick.isoformat()
    if not entry.inserted:
        logger.warning(
            "duplicate tick refused: it already has a run",
            extra={**log, "run_id": entry.id, "state": entry.state, "action": "duplicate_refused"},
        )
        return RunReport("refused", entry.id, entry.tick)
    if store.kind_paused(policy.kind):
        error = f"kind {policy.kind} is paused: its fixed-time runs are skipped until it is resumed"
        return _finish(policy, entry, RunState.SKIPPED, error, 1, log)
    deadline = policy.starting_deadline_seconds
    if trigger != RunTrigger.MANUAL and deadline is not None and entry.late_seconds > deadline:
        error = f"started {entry.late_seconds:.1f}s after its tick; the starting deadline is {deadline}s"
        return _finish(policy, entry, RunState.MISSED, error, 1, log)
    try:
        kind = registry.get(policy.kind)
    except exceptions.UnknownJobKind as exc:
        return _finish(policy, entry, RunState.FAILED, str(exc), 1, log)
    if lock is not None and not lock.try_acquire():
        if policy.concurrency_policy == ConcurrencyPolicy.FORBID:
            return _finish(policy, entry, RunState.SKIPPED, "the previous run is still going (forbid)", 1, log)
        if not _replace_previous(policy, entry, lock, log):
            wait = conf.get().fixed_replace_wait_seconds
            error = f"the previous run did not stop within {wait:g}s (replace)"
            return _finish(policy, entry, RunState.SKIPPED, error, 1, log)
    if lock is not None:
        # Runs admitted under allow before an edit hold no lock: forbid waits for them, replace stops them.
        unlocked = [r for r in store.running_schedule_runs(policy.pk, entry.id) if r.holds_lock is False]
        if unlocked and policy.concurrency_policy == ConcurrencyPolicy.FORBID:
            error = "the previous run is still going (forbid; it was admitted under allow, before an edit)"
            return _finish(policy, entry, RunState.SKIPPED, error, 1, log)
        for previous in unlocked:
            _stop(previous, log)  # replace: it holds no lock to wait for; it is marked replaced below
        _close_orphans(policy, entry, log, unlocked_too=bool(unlocked))
    return entry, kind


def run_now(schedule: str | PeriodicTask | SchedulePolicy) -> str:
    """Send a manual run of ``schedule`` through the gate; its tick is the database clock now.

    Returns the Celery task id. The message is signed (``messages``); a redelivery of it is refused
    like any duplicate tick.
    """
    if isinstance(schedule, SchedulePolicy):
        name = schedule.periodic_task.name
    elif isinstance(schedule, PeriodicTask):
        name = schedule.name
    else:
        name = schedule
    policy = find(name)
    tick = core_store.database_now()
    kwargs = messages.message_kwargs(name, tick, RunTrigger.MANUAL, policy_id=policy.pk)
    result = current_app.send_task(tasknames.RUN_FIXED, kwargs=kwargs)
    logger.info("manual run sent", extra={"schedule": name, "tick": tick.isoformat(), "action": "run_now"})
    audit.record(
        "schedule_run_now",
        changed=1,
        selected=1,
        kind=policy.kind,
        target=f"schedule {name}",
        details={"tick": tick.isoformat(), "task_id": str(result.id)},
    )
    return str(result.id)


def _replace_previous(
    policy: SchedulePolicy, entry: store.LedgerEntry, lock: locks.AdvisoryLock, log: dict[str, Any]
) -> bool:
    """Stop the running run(s) of the schedule and wait for the lock; True once it is held."""
    for previous in store.running_schedule_runs(policy.pk, entry.id):
        _stop(previous, log)
    deadline = time.monotonic() + conf.get().fixed_replace_wait_seconds
    while time.monotonic() < deadline:
        time.sleep(LOCK_POLL_SECONDS)
        if lock.try_acquire():
            return True
    return False


def _stop(previous: store.RunningRun, log: dict[str, Any]) -> None:
    """Revoke a running run's Celery task (``terminate``: its worker stops the handler)."""
    if not previous.task_id:
        logger.warning(
            "cannot stop the previous run: it has no Celery task id",
            extra={**log, "previous_run_id": previous.id, "action": "replace_unstoppable"},
        )
        return
    current_app.control.revoke(previous.task_id, terminate=True, signal="SIGTERM")
    logger.info(
        "stopping the previous run (replace)",
        extra={
            **log,
            "previous_run_id": previous.id,
            "previous_tick": previous.tick.isoformat(),
            "worker": previous.worker,
            "action": "replace_revoke",
        },
    )


def _deadline_seconds(policy: SchedulePolicy) -> float | None:
    """How long a run of ``policy`` may go (``_execute``'s timeout): its active deadline, else its kind's timeout."""
    if policy.active_deadline_seconds:
        return float(policy.active_deadline_seconds)
    try:
        return float(registry.get(policy.kind).timeout_seconds)
    except exceptions.UnknownJobKind:
        return None  # the run fails at once (_admit)


def _close_orphans(
    policy: SchedulePolicy, entry: store.LedgerEntry, log: dict[str, Any], *, unlocked_too: bool = False
) -> None:
    """With the lock held, no other run of the schedule that took it can be going: close rows still saying so.

    ``unlocked_too``: replace also marks the runs admitted under allow (no lock), which it has just stopped.
    """
    if policy.concurrency_policy == ConcurrencyPolicy.REPLACE:
        state, error = RunState.REPLACED, f"stopped for the run of {entry.tick.isoformat()}"
    else:
        state, error = RunState.FAILED, "the worker running it was lost (its lock was released without an outcome)"
    replacing = unlocked_too and policy.concurrency_policy == ConcurrencyPolicy.REPLACE
    closed = store.close_other_running_runs(policy.pk, entry.id, state, error, unlocked_too=replacing)
    if closed:
        replaced = state == RunState.REPLACED
        message = "marked the stopped runs replaced" if replaced else "closed runs whose worker is gone"
        logger.warning(message, extra={**log, "run_ids": closed, "state": state, "action": "closed"})


def _execute(
    policy: SchedulePolicy, kind: registry.Kind, entry: store.LedgerEntry, log: dict[str, Any]
) -> tuple[RunState, str, int]:
    """Run the handler with retries under the active deadline: (state, error, attempts made).

    A handler's choice (docs/architecture.md, "Handler-chosen outcomes"): ``Discard`` and ``Cancel``
    end the run at once, ``discarded`` / ``cancelled`` with the reason; ``RetryAfter`` is one of the
    schedule's retries (``backoff_limit``) after its delay instead of the backoff; ``Snooze`` calls
    again after its delay within the same tick, not counted as a retry, at most the kind's
    ``max_snoozes`` times (then it is a failure). All of it within the active deadline.
    """
    max_attempts = policy.backoff_limit + 1
    timeout = float(policy.active_deadline_seconds or kind.timeout_seconds)
    ref = f"{policy.periodic_task.name}@{entry.tick.isoformat()}"
    attempt = 1
    snoozes = 0
    try:
        # One deadline over every attempt and the pauses between them: the policy's active deadline.
        # An operator's abort (abort_run) is read by a watcher and raised in the handler like it.
        with (
            executor.alarms(),
            _watching_aborts(entry.id),
            aborts.running(entry.id, ABORT_CLAIM),
            executor.deadline(timeout),
        ):
            while True:
                asked = aborts.requested(entry.id, ABORT_CLAIM)
                if asked is not None:  # between attempts: no further one starts
                    return RunState.ABORTED, asked, attempt
                job = registry.Job(
                    kind=kind.name,
                    payload=policy.payload if isinstance(policy.payload, dict) else {},
                    attempt=attempt,
                    max_attempts=max_attempts,
                    due_at=entry.tick,
                    mechanism=registry.Mechanism.FIXED,
                    ref=ref,
                )
                result = executor.invoke(kind, job, None)
                if result.ok:
                    return RunState.SUCCEEDED, "", attempt
                if result.outcome == executor.ABORTED:
                    logger.warning("fixed-time run aborted", extra={**log, "run_id": entry.id, "action": "aborted"})
                    return RunState.ABORTED, result.error, attempt
                if result.outcome in (RunState.DISCARDED, RunState.CANCELLED):
                    return RunState(result.outcome), result.error, attempt
                if result.outcome == AttemptOutcome.SNOOZED and snoozes < kind.max_snoozes:
                    snoozes += 1
                    time.sleep(result.delay_seconds or 0.0)
                    continue
                if attempt >= max_attempts:
                    logger.warning("fixed-time run failed", extra={**log, "run_id": entry.id, "attempt": attempt})
                    return RunState.FAILED, result.error, attempt
                delay = kind.backoff.delay(attempt)
                if result.outcome == AttemptOutcome.RETRY_AFTER and result.delay_seconds is not None:
                    delay = result.delay_seconds
                logger.info(
                    "fixed-time run failed; retrying within the tick",
                    extra={**log, "run_id": entry.id, "attempt": attempt, "retry_in_seconds": round(delay, 3)},
                )
                attempt += 1
                store.set_schedule_run_attempt(entry.id, attempt)
                time.sleep(delay)
    except executor.JobAborted as exc:  # in the pause between two attempts
        logger.warning("fixed-time run aborted", extra={**log, "run_id": entry.id, "action": "aborted"})
        return RunState.ABORTED, str(exc), attempt
    except executor.JobTimeout:
        logger.warning("fixed-time run timed out", extra={**log, "run_id": entry.id, "timeout_seconds": timeout})
        return RunState.TIMED_OUT, f"stopped after {timeout:g}s (active deadline)", attempt


ABORT_CLAIM = "fixed-run"  # a run's claim in core/aborts.py: (run id, this); never a due_at job's token (a UUID)


@contextlib.contextmanager
def _watching_aborts(run_id: int) -> Iterator[None]:
    """While the run goes, read its row every heartbeat interval for an abort (a thread and connection of its own).

    A fixed-time run has no lease to renew, so it has no heartbeat to read the abort with; its
    watcher does that one read. An abort found is handed to ``core/aborts.py``, which interrupts
    the handler (SIGALRM on the main thread) as for a due_at job. Heartbeats off (0): no watcher.
    """
    interval = conf.get().heartbeat_seconds
    if interval <= 0:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        try:
            while not stop.wait(interval):
                try:
                    asked = store.run_abort(run_id)
                except DatabaseError:
                    logger.warning("could not read the run's abort; will retry", exc_info=True)
                    connection.close()
                    continue
                if asked is not None:
                    aborts.request(run_id, ABORT_CLAIM, aborts.reason(asked.by, asked.at))
                    return
        finally:
            connection.close()

    thread = threading.Thread(target=watch, name=f"timekeeper-run-{run_id}-aborts", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(WATCHER_JOIN_SECONDS)
        aborts.forget([(run_id, ABORT_CLAIM)])


WATCHER_JOIN_SECONDS = 5.0  # how long a finished run waits for its abort watcher's last read


def abort_run(run_id: int, *, by: str | None = None) -> None:
    """Abort the running fixed-time run ``run_id``: its handler is interrupted within about a heartbeat interval.

    The run is then recorded ``aborted`` with who asked (``by``, else the door's operator) and when;
    no further attempt of the tick starts. ``RunNotRunning`` when it finished before the abort arrived.
    """
    found = validation.row_id(run_id, "run_id")  # True or "abc" would reach the SQL as they are
    if found is None:
        raise exceptions.RunNotRunning(run_id, None)
    run_id = found
    asker = aborts.asker(by)
    if not store.request_run_abort(run_id, asker):
        state = ScheduleRun.objects.filter(pk=run_id).values_list("state", flat=True).first()
        raise exceptions.RunNotRunning(run_id, state)
    logger.info("fixed-time run abort requested", extra={"run_id": run_id, "action": "abort_requested"})
    audit.record("abort", changed=1, target=f"schedule run #{run_id}", details={"run_id": run_id})


def _finish(
    policy: SchedulePolicy, entry: store.LedgerEntry, state: RunState, error: str, attempt: int, log: dict[str, Any]
) -> RunReport:
    recorded = store.finish_schedule_run(entry.id, state, error[: executor.ERROR_TEXT_LIMIT])
    if not recorded:
        logger.warning(
            "outcome not recorded: the run was closed meanwhile (replaced)",
            extra={**log, "run_id": entry.id, "state": state, "action": "outcome_refused"},
        )
    else:
        level = logging.INFO if state == RunState.SUCCEEDED else logging.WARNING
        logger.log(level, f"fixed-time run {state}", extra={**log, "run_id": entry.id, "state": state})
    pruned = store.prune_schedule_runs(policy.pk, policy.successful_history_limit, policy.failed_history_limit)
    if pruned:
        logger.debug("history pruned", extra={**log, "pruned": pruned, "action": "pruned"})
    return RunReport(state if recorded else "closed", entry.id, entry.tick, attempt)
