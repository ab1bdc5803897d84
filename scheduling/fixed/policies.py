"""Fixed-time schedule policies: their timing, validation, description, preview and safe edits.

A fixed-time schedule is a django-celery-beat ``PeriodicTask`` (its ``crontab`` with the crontab's
time zone, or its ``interval``) plus the ``SchedulePolicy`` beside it. The timing is read from
django-celery-beat's rows, so an edit of the crontab in the admin is what beat follows; the policy
adds the DST rule and everything else.

For the admin (which calls these, it holds no logic of its own):

- ``validate_policy(policy, periodic_task)``: raises ``InvalidCronExpression``, ``UnknownTimeZone``,
  ``InvalidSchedule``, ``UnknownJobKind``, ``InvalidPayload`` or ``InvalidPolicy`` (a timeout not
  shorter than the shortest interval, ...). The exception's ``field`` attribute names the form
  field to attach it to (or ``None``).
- ``describe(periodic_task_or_policy)``: e.g. ``At 03:00 AM (Europe/Lisbon)``.
- ``preview(periodic_task_or_policy, n=5)``: the next ``n`` run times, aware, in the schedule's zone.
- ``note_timing_change(periodic_task_or_policy)``: call after saving (the signals registered in
  ``apps.ready`` already do, and beat re-checks): moves the anchor forward when the timing changed.

Safe edits: each policy stores a fingerprint of its timing (``timing_key``: expression, zone, DST
rule or interval, plus whether it is suspended or disabled). When a save changes the fingerprint,
``anchor_at`` moves to that moment: ticks before the edit never fire (django-celery-beat fires an
edited crontab at once when its last run is older than the new schedule's previous tick, #537 and
#683) and the first tick of the new timing after the edit does (none is lost). The signals below
catch saves through the ORM and the admin; a ``QuerySet.update()`` bypasses them, so beat compares
the fingerprint too before planning (``beat.FixedEntry``) and moves the anchor itself.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any
from zoneinfo import ZoneInfo

from django.db import connection, transaction
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from scheduling.core import exceptions, registry, validation
from scheduling.fixed import cron, spec, store, ticks
from scheduling.models import ConcurrencyPolicy, DstGapPolicy, MissedPolicy, SchedulePolicy

logger = logging.getLogger(__name__)

PERIOD_SECONDS: dict[str, float] = {
    IntervalSchedule.DAYS: 86_400.0,
    IntervalSchedule.HOURS: 3_600.0,
    IntervalSchedule.MINUTES: 60.0,
    IntervalSchedule.SECONDS: 1.0,
    IntervalSchedule.MICROSECONDS: 1e-6,
}


def _pair(obj: PeriodicTask | SchedulePolicy) -> tuple[PeriodicTask, SchedulePolicy | None]:
    if isinstance(obj, SchedulePolicy):
        return obj.periodic_task, obj
    try:
        return obj, obj.policy
    except SchedulePolicy.DoesNotExist:
        return obj, None


def crontab_expression(crontab: CrontabSchedule) -> str:
    """The five-field expression of a django-celery-beat crontab row."""
    return " ".join(
        str(part).strip()
        for part in (crontab.minute, crontab.hour, crontab.day_of_month, crontab.month_of_year, crontab.day_of_week)
    )


def interval_seconds(interval: IntervalSchedule) -> float:
    """An interval row's length in seconds; ``InvalidSchedule`` for an unknown period."""
    try:
        return float(interval.every) * PERIOD_SECONDS[interval.period]
    except KeyError:
        raise exceptions.InvalidSchedule(f"Unknown interval period {interval.period!r}.") from None


def timing_of(periodic_task: PeriodicTask, policy: SchedulePolicy | None = None) -> ticks.Timing:
    """The timing beat follows for a periodic task: its crontab (in the crontab's zone) or its interval.

    The declared expression (a nickname such as ``@daily``) is kept when it still expands to the
    crontab's fields, so descriptions show it; otherwise the crontab's fields win (it was edited).
    Raises ``InvalidCronExpression``, ``UnknownTimeZone``, ``InvalidSchedule`` or ``InvalidPolicy``
    (a solar or clocked schedule, which fixed-time runs do not support).
    """
    dst_gap = policy.dst_gap if policy is not None else DstGapPolicy.SHIFT
    if periodic_task.crontab_id is not None or getattr(periodic_task, "crontab", None) is not None:
        crontab = periodic_task.crontab
        fields = crontab_expression(crontab)
        zone = str(crontab.timezone)
        expression = fields
        declared = policy.expression if policy is not None else ""
        if declared:
            try:
                if cron.expand(declared) == cron.expand(fields):
                    expression = declared
            except exceptions.SchedulingError:
                pass
        return ticks.Timing.from_cron(expression, zone, dst_gap)
    if periodic_task.interval_id is not None or getattr(periodic_task, "interval", None) is not None:
        return ticks.Timing.from_interval(interval_seconds(periodic_task.interval))
    raise exceptions.InvalidPolicy(
        f"Schedule {periodic_task.name!r} needs a crontab or an interval; solar and clocked schedules "
        "cannot carry a fixed-time policy."
    )


def timing_from(expression: str, timezone: str, every_seconds: float | None, dst_gap: str) -> ticks.Timing:
    """The timing a policy's own fields describe (the admin's form): a cron expression in ``timezone``, or
    ``every_seconds``. Named errors carry ``.field`` (``expression``, ``timezone`` or ``every_seconds``)."""
    if expression and every_seconds:
        raise _invalid(
            exceptions.InvalidSchedule("Give a cron expression or an interval in seconds, not both."), "every_seconds"
        )
    if not expression and not every_seconds:
        raise _invalid(exceptions.InvalidSchedule("Give a cron expression or an interval in seconds."), "expression")
    try:
        if expression:
            return ticks.Timing.from_cron(expression, timezone or "UTC", dst_gap)
        assert every_seconds is not None
        return ticks.Timing.from_interval(every_seconds)
    except exceptions.InvalidCronExpression as exc:
        raise _invalid(exc, "expression") from None
    except exceptions.UnknownTimeZone as exc:
        raise _invalid(exc, "timezone") from None
    except exceptions.InvalidSchedule as exc:
        raise _invalid(exc, "every_seconds") from None
    except exceptions.InvalidPolicy as exc:
        raise _invalid(exc, "dst_gap") from None


def timing_key(periodic_task: PeriodicTask, policy: SchedulePolicy) -> str:
    """The fingerprint whose change moves the anchor: timing, suspension and enabled state."""
    try:
        key = timing_of(periodic_task, policy).key
    except exceptions.SchedulingError as exc:
        key = f"invalid {type(exc).__name__}"
    flags = []
    if policy.suspend:
        flags.append("suspended")
    if not periodic_task.enabled:
        flags.append("disabled")
    return " ".join([key, *flags])[:300]


def tick_state(policy: SchedulePolicy, periodic_task: PeriodicTask | None = None) -> ticks.TickState:
    """The policy row as the tick planner sees it."""
    task = periodic_task or policy.periodic_task
    return ticks.TickState(
        timing=timing_of(task, policy),
        anchor_at=policy.anchor_at,
        last_tick=policy.last_tick,
        suspended=bool(policy.suspend or not task.enabled),
        missed_policy=policy.missed_policy,
        missed_window_seconds=float(policy.missed_window_seconds),
        starting_deadline_seconds=(
            float(policy.starting_deadline_seconds) if policy.starting_deadline_seconds is not None else None
        ),
    )


def _invalid(exc: exceptions.SchedulingError, field: str | None) -> exceptions.SchedulingError:
    exc.field = field  # type: ignore[attr-defined]
    return exc


WHOLE_NUMBERS = (
    "starting_deadline_seconds",
    "active_deadline_seconds",
    "backoff_limit",
    "missed_window_seconds",
    "successful_history_limit",
    "failed_history_limit",
)


def _column_range(name: str) -> int:
    """The largest value the policy row's integer column ``name`` holds (PostgreSQL's smallint or integer)."""
    field = SchedulePolicy._meta.get_field(name)
    return int(connection.ops.integer_field_range(field.get_internal_type())[1])


def check(timing: ticks.Timing, policy: spec.PolicySpec) -> None:
    """Every rule a fixed-time schedule's policy must pass with ``timing`` (declarations and the admin share it).

    Raises the named error with ``.field``, the policy field it is about (or ``None``).
    """
    if not isinstance(policy.kind, str):
        raise _invalid(exceptions.InvalidPolicy(f"kind must be a kind's name, not {policy.kind!r}."), "kind")
    try:
        handler = registry.get(policy.kind)
    except exceptions.UnknownJobKind as exc:
        raise _invalid(exc, "kind") from None
    for name in WHOLE_NUMBERS:  # the columns' ranges: past them the sync was a database error, not a named one
        value = getattr(policy, name)
        most = _column_range(name)
        if value is None and SchedulePolicy._meta.get_field(name).null:
            continue
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # 60.0 as before
        if isinstance(value, bool) or not whole or not 0 <= value <= most:
            raise _invalid(exceptions.InvalidPolicy(f"{name} must be a whole number from 0 to {most}."), name)
    if policy.dst_gap not in DstGapPolicy.values:  # checked for an interval too: the row stores it
        raise _invalid(exceptions.InvalidPolicy(f"Unknown DST gap policy {policy.dst_gap!r}."), "dst_gap")
    try:
        validation.encode_payload(handler, policy.payload)  # the kind's limits (size, depth) and schema, as every door
    except exceptions.InvalidPayload as exc:
        raise _invalid(exc, "payload") from None
    if policy.concurrency_policy not in ConcurrencyPolicy.values:
        raise _invalid(
            exceptions.InvalidPolicy(f"Unknown concurrency policy {policy.concurrency_policy!r}."), "concurrency_policy"
        )
    if policy.missed_policy not in MissedPolicy.values:
        raise _invalid(
            exceptions.InvalidPolicy(f"Unknown missed-tick policy {policy.missed_policy!r}."), "missed_policy"
        )
    if policy.active_deadline_seconds is not None:
        shortest = timing.min_interval_seconds()
        if policy.active_deadline_seconds <= 0:
            raise _invalid(exceptions.InvalidPolicy("The run timeout must be positive."), "active_deadline_seconds")
        if policy.active_deadline_seconds >= shortest:
            raise _invalid(
                exceptions.InvalidPolicy(
                    f"The run timeout ({policy.active_deadline_seconds:g}s) must be shorter than the schedule's "
                    f"shortest interval ({shortest:g}s: {timing.describe()}), or a run could still be going at the "
                    "next tick."
                ),
                "active_deadline_seconds",
            )
    if policy.starting_deadline_seconds is not None and policy.starting_deadline_seconds <= 0:
        raise _invalid(
            exceptions.InvalidPolicy("The starting deadline must be positive (or empty for none)."),
            "starting_deadline_seconds",
        )
    if policy.missed_policy == MissedPolicy.RUN_ALL and policy.missed_window_seconds <= 0:
        raise _invalid(
            exceptions.InvalidPolicy("run_all needs a positive missed-tick window."), "missed_window_seconds"
        )


def _check_celery_reads(crontab: CrontabSchedule) -> None:
    """``InvalidCronExpression`` unless the crontab row is written the way Celery's crontab reads it.

    django-celery-beat builds Celery's ``crontab`` from the row when beat loads it, and drops the
    entry without a word when that fails (day of week 7, which cron accepts and Celery does not).
    """
    fields = crontab_expression(crontab)
    wanted = cron.expand(fields)
    if wanted != " ".join(fields.split()):
        raise exceptions.InvalidCronExpression(
            f"Celery cannot read the day of week {crontab.day_of_week!r}: write it as {wanted.split()[4]!r} "
            "(the same days; Celery knows Sunday as 0 only)."
        )


def validate_policy(policy: SchedulePolicy, periodic_task: PeriodicTask | None = None) -> None:
    """Raise a named error (with ``.field``) unless the policy and its periodic task can work.

    Works on unsaved instances: pass the periodic task being edited when the policy's own relation
    is not set yet (the admin's inline).
    """
    task = periodic_task if periodic_task is not None else policy.periodic_task
    try:
        timing = timing_of(task, policy)
        if timing.crontab is not None:
            _check_celery_reads(task.crontab)
    except exceptions.InvalidPolicy as exc:
        raise _invalid(exc, None) from None
    except (exceptions.InvalidCronExpression, exceptions.UnknownTimeZone, exceptions.InvalidSchedule) as exc:
        raise _invalid(exc, None) from None
    check(timing, spec.PolicySpec.of(policy))


def describe(obj: PeriodicTask | SchedulePolicy) -> str:
    """A readable description of the schedule, or what is wrong with it."""
    task, policy = _pair(obj)
    try:
        return timing_of(task, policy).describe()
    except exceptions.SchedulingError as exc:
        return f"invalid schedule: {exc}"


def preview(obj: PeriodicTask | SchedulePolicy, n: int = 5, after: dt.datetime | None = None) -> list[dt.datetime]:
    """The next ``n`` run times after ``after`` (default: now), aware, in the schedule's zone.

    Works on unsaved instances, so the admin can show it before saving an edit (an edit moves the
    anchor to the moment of saving, so these are the runs the edit will produce). A suspended
    schedule has none. Raises the timing's validation errors.
    """
    task, policy = _pair(obj)
    if policy is not None and policy.suspend:
        return []
    timing = timing_of(task, policy)
    start = after or dt.datetime.now(dt.UTC)
    zone = ZoneInfo(timing.timezone)
    return [tick.astimezone(zone) for tick in timing.next_n(start, n)]


def note_timing_change(obj: PeriodicTask | SchedulePolicy, at: dt.datetime | None = None) -> dt.datetime | None:
    """Move the anchor forward to ``at`` (default: database now) if the timing fingerprint changed.

    Returns the new anchor, or None when nothing changed. Idempotent: the update is conditional on
    the stored fingerprint.
    """
    task, policy = _pair(obj)
    if policy is None or policy.pk is None:
        return None
    key = timing_key(task, policy)
    moved = store.move_anchor_for_timing(policy.pk, key, at)
    if moved is not None:
        policy.anchor_at = moved
        policy.timing_key = key
        logger.info(
            "schedule timing changed; counting ticks from now on",
            extra={"schedule": task.name, "timing": key, "anchor_at": moved.isoformat(), "action": "anchor_moved"},
        )
    return moved


# --- Signal receivers (connected in scheduling.apps) -------------------------------------------------


def _after_commit_note(policy_ids: list[int]) -> None:
    def note() -> None:
        for policy in SchedulePolicy.objects.select_related(
            "periodic_task", "periodic_task__crontab", "periodic_task__interval"
        ).filter(pk__in=policy_ids):
            note_timing_change(policy)

    if policy_ids:
        transaction.on_commit(note)


def note_timing_changes(policy_ids: Sequence[int]) -> None:
    """``note_timing_change`` of each policy once the transaction commits: for bulk edits that send no signal.

    Beat cannot catch a disabled task's change itself (it does not load disabled tasks), so a list
    action that disables and enables again must move the anchor here, or the time it was off counts
    as missed (or is replayed, with ``run_all``).
    """
    _after_commit_note(list(policy_ids))


def on_policy_saved(sender: type, instance: SchedulePolicy, **kwargs: Any) -> None:
    """post_save of a SchedulePolicy: a new fingerprint (DST rule, suspension) moves the anchor."""
    _after_commit_note([instance.pk])


def on_periodic_task_saved(sender: type, instance: PeriodicTask, **kwargs: Any) -> None:
    """post_save of a PeriodicTask: another crontab or interval, or enabled again, moves the anchor."""
    _after_commit_note(list(SchedulePolicy.objects.filter(periodic_task_id=instance.pk).values_list("pk", flat=True)))


def on_crontab_saved(sender: type, instance: CrontabSchedule, **kwargs: Any) -> None:
    """post_save of a CrontabSchedule: every schedule using it may have new timing."""
    ids = SchedulePolicy.objects.filter(periodic_task__crontab_id=instance.pk).values_list("pk", flat=True)
    _after_commit_note(list(ids))


def on_interval_saved(sender: type, instance: IntervalSchedule, **kwargs: Any) -> None:
    """post_save of an IntervalSchedule: every schedule using it may have new timing."""
    ids = SchedulePolicy.objects.filter(periodic_task__interval_id=instance.pk).values_list("pk", flat=True)
    _after_commit_note(list(ids))
