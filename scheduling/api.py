"""Timekeeper's public contract, one import for application code: ``from scheduling import api``.

Per-entity future work (``scheduling.due_at``): ``schedule()`` writes a row in the caller's
transaction; ``cancel()`` and ``reschedule()`` change it only while it is pending;
``schedule_many()`` loads many in one statement. ``cancel_many()``, ``reschedule_many()``,
``run_now_many()`` and ``retry_dead_many()`` change a selection of ids in one statement each and
return a ``BulkResult`` (the ids changed, and the others with the state that kept them out): the
admin's bulk actions are these calls.

Short deferrals: ``defer()`` picks the mechanism. Up to the broker ceiling and without a key it is
a Celery countdown message and no row (``scheduling.deferrals``); longer, or with a key (to find,
move or cancel it), it is ``schedule()``. Its handle says which mechanism was used.

Recurring per-entity work (``scheduling.recurring``): ``recur()`` makes a recurrence (a cron
expression or ``every=`` seconds on the entity's own zone, a key per owner) whose occurrences are
due_at jobs, one pending at a time; ``change_recurrence()``, ``pause_recurrence()``,
``resume_recurrence()``, ``cancel_recurrence()``, ``next_occurrences()``, and the bulk
``recur_many()``, ``pause_recurrences()``, ``resume_recurrences()``, ``cancel_recurrences()``.

``status()`` gathers the numbers operators watch from the table and the broker. ``retire_owner()``
runs before a user is deleted (the user model's ``pre_delete``): their waiting work is cancelled and
their jobs keep who owned them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from scheduling.core import registry, validation
from scheduling.deferrals import countdowns
from scheduling.due_at import api as jobs_api
from scheduling.due_at.api import *  # noqa: F403 -- the public names of the due_at engine: due_at/api.py's __all__
from scheduling.recurring import api as recurring_api
from scheduling.recurring.api import *  # noqa: F403 -- the recurrences' public names: recurring/api.py's __all__

logger = logging.getLogger(__name__)

# The doors' setter of any per-kind option (core/kind_options.py); code uses the option's own
# function (set_max_running). Not in __all__: the public names stay as they were.
set_kind_option = jobs_api.set_kind_option

Deferral = countdowns.Deferral


def defer(kind: str, payload: Any, delay: float | int | dt.timedelta, *, key: str | None = None) -> Deferral:
    """Run ``kind`` with ``payload`` after ``delay``: a broker countdown when short and keyless, else a row.

    Up to ``SCHEDULING_BROKER_DELAY_MAX_SECONDS`` (900 s) and with no ``key``: a Celery message,
    sent when the caller's transaction commits, that cannot be listed or cancelled. Longer, or with
    a ``key`` (to find, move or cancel it): ``schedule(kind, payload, delay=delay, key=key)``.
    Validates like ``schedule()`` before anything is sent or stored; ``DelayTooLong`` if the
    broker's visibility-timeout guard would break, ``BrokerNotConfigured`` when no Celery app or
    broker is configured (instead of sending to Celery's default, amqp://localhost). Returns
    ``Deferral(mechanism, id, due_at)``.
    """
    job_kind = registry.get(kind)
    validation.encode_payload(job_kind, payload)
    seconds = validation.delay_seconds(delay)
    if key is None and seconds <= countdowns.ceiling_seconds():
        return countdowns.send(job_kind, payload, seconds)
    job = jobs_api.schedule(kind, payload, delay=seconds, key=key)
    logger.info(
        "deferral stored as a due_at row",
        extra={
            "job_id": job.id,
            "kind": kind,
            "action": "deferred_to_table",
            "reason": "key" if key is not None else "over_ceiling",
        },
    )
    return Deferral(mechanism=registry.Mechanism.DUE_AT, id=job.id, due_at=job.due_at)


def retire_owner(owner: Any) -> jobs_api.BulkResult:
    """Before ``owner`` (a user or its id) is deleted: cancel what waits for them, and mark their jobs as theirs.

    Called by the ``pre_delete`` of the user model, inside the deletion's transaction, so it holds
    for the admin, ``user.delete()`` and ``QuerySet.delete()``. In order: the user's row is locked
    (a job or occurrence inserted for them meanwhile cannot commit before the deletion, and fails
    after it); their recurrences are cancelled (``cancel_recurrences``: no further occurrence); their
    pending jobs are cancelled (``cancel_many``: one statement, conditional on ``pending``), and so
    are their claims not yet started (conditional on the ``claimed`` state: the runner then finds the
    claim lost); and every job of theirs gets ``former_owner`` ("username (#id)"), since the deletion
    then empties the owner and the history must not read as the system's. Running jobs are left to
    end with the attempt they are on (their ``max_attempts`` becomes their ``attempts``: a failure is
    final, never a retry as nobody's job) and lose their key (with the owner emptied it would be the
    system's key: ``schedule(key=...)`` by system code must not meet them); a claim given back
    (unclaimed, swept, a lost chunk released) is cancelled, never pending again. A handler that asks
    ``job.owner_id`` gets ``OwnerDeleted``, so it fails instead of acting with the system's rights.
    Returns the result of the pending jobs' cancel.
    """
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.db.models import Case, F, Value, When
    from django.db.models.functions import Now

    from scheduling.models import LIVE_STATES, JobState, Recurrence, RecurrenceState, ScheduledJob

    owner_id = getattr(owner, "pk", owner)
    with transaction.atomic():
        users = get_user_model().objects.select_for_update().filter(pk=owner_id)
        user = users.first()
        label = f"{user.get_username()} (#{owner_id})" if user is not None else f"#{owner_id}"
        live = [RecurrenceState.ACTIVE, RecurrenceState.PAUSED, RecurrenceState.ENDED]
        theirs = Recurrence.objects.filter(owner_id=owner_id, state__in=live).values_list("pk", flat=True)
        recurring_api.cancel_recurrences(theirs)
        waiting = ScheduledJob.objects.filter(owner_id=owner_id, state=JobState.PENDING).values_list("pk", flat=True)
        result = jobs_api.cancel_many(waiting)
        # A claim not yet started ran nothing: cancelled too (conditional on the claimed state, which
        # start_jobs requires, so the runner sees the claim as lost). Left claimed, it would stay in
        # the waiting-key index and collide with the system's job of that key once the owner is emptied.
        unstarted = ScheduledJob.objects.filter(owner_id=owner_id, state=JobState.CLAIMED).update(
            state=JobState.CANCELLED, finished_at=Now(), updated_at=Now()
        )
        # One statement: every job of theirs says who owned it; a claimed one's current attempt is its
        # last; a job still live (running) gives up its key, so the key never reaches the system's namespace.
        last_attempt = Case(When(state=JobState.RUNNING, then=F("attempts")), default=F("max_attempts"))
        live_key = Case(When(state__in=LIVE_STATES, then=Value(None)), default=F("key"))
        marked = ScheduledJob.objects.filter(owner_id=owner_id).update(
            former_owner=label[:200], max_attempts=last_attempt, key=live_key
        )
    logger.info(
        "owner retired: their waiting work cancelled",
        extra={
            "owner_id": owner_id,
            "cancelled": len(result.changed) + unstarted,
            "marked": marked,
            "action": "owner_retired",
        },
    )
    return result


def on_owner_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``pre_delete`` of the user model: ``retire_owner`` (their pending jobs never run as the system's)."""
    retire_owner(instance)


def check_not_past(due_at: dt.datetime) -> None:
    """Raise ``DueAtInPast`` when ``due_at`` is older than the database clock less the skew tolerance.

    The rule the JSON API and the admin hold outside callers to; a view that turns a person's input
    into a due time (the demo's trial end) applies it too, so every door refuses the same time.
    """
    validation.check_not_past(due_at)


def abort_schedule_run(run_id: int, *, by: str | None = None) -> None:
    """Abort a running fixed-time run: its handler is interrupted within about a heartbeat interval, recorded aborted.

    ``RunNotRunning`` when it finished before the abort arrived. The gate's ``abort_run``
    (docs/architecture.md, "Aborting a running job").
    """
    from scheduling.fixed import gate  # the gate imports Celery's app: only when a run is aborted

    gate.abort_run(run_id, by=by)


def status(*, include_broker: bool = True) -> dict[str, Any]:
    """The numbers operators watch: backlog (pending and overdue), oldest overdue age, claimed, stuck.

    ``broker`` holds the broker's counts (``countdowns.broker_counts()``: visible, delayed, in
    flight, unacked), or None when Redis does not answer; ``include_broker=False`` skips reading
    Redis (which reads every queued message to sort them by ETA) when only the table matters.
    ``queues`` lists each named queue (its due jobs, its Celery queue, the live workers serving it;
    None: unknown) and ``queues_without_workers`` the ones with due work and no live worker.
    """
    numbers = jobs_api.status()
    if include_broker:
        numbers["broker"] = countdowns.broker_counts()
        queues = jobs_api.queue_status()
        numbers["queues"] = [{**dataclasses.asdict(q), "unserved": q.unserved} for q in queues]
        numbers["queues_without_workers"] = [q.queue for q in queues if q.unserved]
    return numbers


# Each public name is listed once, in the module that defines it (its ``__all__``); this facade adds its own.
__all__ = sorted(
    ["Deferral", "abort_schedule_run", "defer", "retire_owner", "status", *jobs_api.__all__, *recurring_api.__all__]
)
