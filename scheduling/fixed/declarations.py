"""Fixed-time schedules declared in code and synced into django-celery-beat's tables.

Handlers are registered with ``@registry.handler("reports.settlement", ...)``; a schedule that
runs one is declared next to it, in ``tasks/``::

    schedules.declare(
        name="nightly-settlement", kind="reports.settlement", cron="0 3 * * *", timezone="Europe/Lisbon",
        concurrency_policy="forbid", active_deadline_seconds=50 * 60,
    )

``declare()`` validates at import time (``InvalidCronExpression``, ``UnknownTimeZone``,
``InvalidSchedule``, ``InvalidPolicy``). ``sync()`` (the ``sync_schedules`` command, run at every
start of the platform) writes each declaration as a ``CrontabSchedule`` with its zone or an
``IntervalSchedule``, a ``PeriodicTask`` (task ``scheduling.run_fixed``, kwargs
``{"schedule": name}``) and its ``SchedulePolicy``. It is idempotent: rows are written only when
they differ from the declaration, so a second sync changes nothing, bumps no change counter and
moves no anchor. Code wins over admin edits of the declared fields at the next sync; the
operators' switches (``enabled`` on the periodic task, ``suspend`` on the policy) are never
touched after creation, nor is the run history.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
from typing import Any

from django.db import transaction
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from scheduling.core import exceptions, registry, tasknames
from scheduling.fixed import cron, policies, spec, ticks
from scheduling.models import SchedulePolicy

MAX_EVERY_SECONDS = 2**31 - 1  # django-celery-beat's IntervalSchedule.every is an integer column (68 years)
MAX_EXPRESSION_LENGTH: int = SchedulePolicy._meta.get_field("expression").max_length or 0  # the policy row's column

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Declaration(spec.PolicySpec):
    """One fixed-time schedule as declared in code: its name, timing and description, and its policy
    (every field of ``spec.PolicySpec``)."""

    name: str
    cron: str | None
    every: float | None
    timezone: str
    description: str

    @property
    def timing(self) -> ticks.Timing:
        if self.cron is not None:
            return ticks.Timing.from_cron(self.cron, self.timezone, self.dst_gap)
        assert self.every is not None
        return ticks.Timing.from_interval(self.every)


_declared: dict[str, Declaration] = {}
_lock = threading.Lock()


def make(
    *,
    name: str,
    cron: str | None = None,
    every: float | None = None,
    timezone: str = "UTC",
    description: str = "",
    **policy: Any,
) -> Declaration:
    """A validated declaration, not registered (``declare()`` registers one; tests sync their own).

    ``cron`` is an expression or nickname on the wall clock of ``timezone``; ``every`` is a whole
    number of seconds. ``policy``: ``kind`` and any other field of ``spec.PolicySpec``
    (``concurrency_policy``, ``active_deadline_seconds``, ``payload``, ...; the rest take the
    model's defaults). Checks everything that does not need the handler (the kind and payload are
    checked by ``sync()``, when every handler module has been imported).
    """
    if not name or len(name) > 200:
        raise exceptions.InvalidPolicy(f"A schedule name must have 1 to 200 characters, got {name!r}.")
    unknown = sorted(set(policy) - set(spec.PolicySpec.names()))
    if unknown or "kind" not in policy:
        problem = f"unknown argument(s) {', '.join(unknown)}" if unknown else "kind= is required"
        raise exceptions.InvalidPolicy(
            f"Schedule {name!r}: {problem}; a schedule takes name, cron or every, timezone, description "
            f"and the policy's {', '.join(spec.PolicySpec.names())}."
        )
    if (cron is None) == (every is None):
        raise exceptions.InvalidSchedule(f"Schedule {name!r}: give either cron= or every= (seconds), not both.")
    if every is not None and timezone != "UTC":
        raise exceptions.InvalidSchedule(f"Schedule {name!r}: an interval has no time zone; drop timezone=.")
    if every is not None and (
        isinstance(every, bool)
        or not isinstance(every, int | float)
        or not 1 <= every <= MAX_EVERY_SECONDS  # before isfinite() and int(): a huge int overflows one, NaN the other
        or not math.isfinite(every)
        or float(every) != int(every)
    ):
        raise exceptions.InvalidSchedule(
            f"Schedule {name!r}: every= must be a whole number of seconds from 1 to {MAX_EVERY_SECONDS}."
        )
    payload = policy.get("payload") or {}
    if not isinstance(payload, dict):  # dict() of a list or a string was a TypeError or a ValueError
        raise exceptions.InvalidPayload(f"Schedule {name!r}: payload= must be a JSON object (a dict).")
    policy["payload"] = dict(payload)
    if isinstance(cron, str) and len(" ".join(cron.split())) > MAX_EXPRESSION_LENGTH:
        raise exceptions.InvalidCronExpression(
            f"Schedule {name!r}: the cron expression is longer than {MAX_EXPRESSION_LENGTH} characters."
        )
    policy.update([(field, str(value)) for field, value in policy.items() if isinstance(value, str)])  # TextChoices
    declaration = Declaration(
        name=name,
        cron=" ".join(cron.split()) if isinstance(cron, str) else cron,
        every=float(every) if every is not None else None,
        timezone=timezone,
        description=description,
        **policy,
    )
    active_deadline_seconds = declaration.active_deadline_seconds
    timing = declaration.timing  # validates expression, zone, DST rule and interval
    if active_deadline_seconds is not None and active_deadline_seconds >= timing.min_interval_seconds():
        raise exceptions.InvalidPolicy(
            f"Schedule {name!r}: the run timeout ({active_deadline_seconds}s) must be shorter than its shortest "
            f"interval ({timing.min_interval_seconds():g}s)."
        )
    return declaration


def declare(**fields: Any) -> Declaration:
    """Declare a fixed-time schedule in code (see ``make()`` for the arguments); ``sync()`` writes it."""
    declaration = make(**fields)
    with _lock:
        existing = _declared.get(declaration.name)
        if existing is not None and existing != declaration:
            raise exceptions.InvalidPolicy(f"Schedule {declaration.name!r} is declared twice, differently.")
        _declared[declaration.name] = declaration
    return declaration


def declared() -> dict[str, Declaration]:
    """Every declared schedule by name (imports the handler packages first)."""
    registry.autodiscover()
    return dict(_declared)


@dataclasses.dataclass
class SyncReport:
    created: list[str] = dataclasses.field(default_factory=list)
    updated: list[str] = dataclasses.field(default_factory=list)
    unchanged: list[str] = dataclasses.field(default_factory=list)
    disabled: list[str] = dataclasses.field(default_factory=list)


def sync(
    names: list[str] | None = None,
    *,
    declarations: list[Declaration] | None = None,
    disable_undeclared: bool = False,
) -> SyncReport:
    """Write declarations into the database; see the module docstring.

    By default every declared schedule (or those in ``names``); ``declarations`` syncs the given
    ones instead. Raises the validation errors of the first invalid declaration before writing
    anything. ``disable_undeclared`` disables fixed-time periodic tasks no declaration names any
    more (their history stays).
    """
    all_declared = declared() if declarations is None else {d.name: d for d in declarations}
    if names is not None:
        unknown = sorted(set(names) - set(all_declared))
        if unknown:
            raise exceptions.InvalidPolicy(f"No schedule is declared with the name(s) {', '.join(unknown)}.")
    chosen = [all_declared[name] for name in sorted(names if names is not None else all_declared)]
    for declaration in chosen:
        policies.check(declaration.timing, declaration)
    report = SyncReport()
    with transaction.atomic():
        for declaration in chosen:
            outcome = _sync_one(declaration)
            getattr(report, outcome).append(declaration.name)
        if disable_undeclared:
            stale = PeriodicTask.objects.filter(task=tasknames.RUN_FIXED, enabled=True, policy__isnull=False)
            for task in stale.exclude(name__in=list(all_declared)):
                task.enabled = False
                task.save(update_fields=["enabled"])
                report.disabled.append(task.name)
    logger.info(
        "schedules synced",
        extra={
            "schedules_created": len(report.created),
            "schedules_updated": len(report.updated),
            "schedules_unchanged": len(report.unchanged),
            "schedules_disabled": len(report.disabled),
            "action": "synced",
        },
    )
    return report


def _schedule_row(declaration: Declaration) -> CrontabSchedule | IntervalSchedule:
    return schedule_row(declaration.cron, declaration.timezone, declaration.every)


def schedule_row(
    expression: str | None, timezone: str, every_seconds: float | None
) -> CrontabSchedule | IntervalSchedule:
    """The django-celery-beat row for a timing: a ``CrontabSchedule`` in ``timezone`` (nicknames
    expanded) for an expression, else an ``IntervalSchedule`` of ``every_seconds``; found or created."""
    if expression:
        minute, hour, day_of_month, month_of_year, day_of_week = cron.expand(expression).split()
        row, _ = CrontabSchedule.objects.get_or_create(
            minute=minute,
            hour=hour,
            day_of_month=day_of_month,
            month_of_year=month_of_year,
            day_of_week=day_of_week,
            timezone=timezone,
        )
        return row
    assert every_seconds is not None
    row, _ = IntervalSchedule.objects.get_or_create(every=int(every_seconds), period=IntervalSchedule.SECONDS)
    return row


def apply_policy(task: PeriodicTask, policy: SchedulePolicy, timezone: str, every_seconds: float | None) -> bool:
    """Make ``task`` follow ``policy`` (the admin's one place to edit a schedule): its crontab or
    interval from the policy's expression (in ``timezone``) or ``every_seconds``, and ``suspend``
    equal to "not enabled". Saves only what differs; returns whether anything was written."""
    wrote = False
    if policy.expression or every_seconds:
        row = schedule_row(policy.expression or None, timezone, every_seconds)
        is_cron = isinstance(row, CrontabSchedule)
        wanted: dict[str, Any] = {
            "crontab": row if is_cron else None,
            "interval": None if is_cron else row,
            "solar": None,
            "clocked": None,
        }
        if any(_differs(getattr(task, field), value) for field, value in wanted.items()):
            for field, value in wanted.items():
                setattr(task, field, value)
            task.save(update_fields=[*wanted])  # post_save: the anchor moves to the new timing
            wrote = True
    if policy.suspend == task.enabled:
        policy.suspend = not task.enabled
        policy.save(update_fields=["suspend"])
        wrote = True
    return wrote


def _sync_one(declaration: Declaration) -> str:
    schedule_row = _schedule_row(declaration)
    is_cron = isinstance(schedule_row, CrontabSchedule)
    task_fields: dict[str, Any] = {
        "task": tasknames.RUN_FIXED,
        "kwargs": json.dumps({"schedule": declaration.name}),
        "crontab": schedule_row if is_cron else None,
        "interval": None if is_cron else schedule_row,
        "solar": None,
        "clocked": None,
        "one_off": False,
        "description": declaration.description or declaration.timing.describe(),
    }
    task = PeriodicTask.objects.filter(name=declaration.name).first()
    created = task is None
    task_updated = False
    if task is None:
        task = PeriodicTask(name=declaration.name, enabled=True, **task_fields)
        task.save()
    elif any(_differs(getattr(task, field), value) for field, value in task_fields.items()):
        for field, value in task_fields.items():
            setattr(task, field, value)
        task.save()
        task_updated = True
    policy = SchedulePolicy.objects.filter(periodic_task=task).first()
    wanted = {"expression": declaration.cron or "", **declaration.columns()}
    policy_updated = False
    if policy is None:
        policy = SchedulePolicy(periodic_task=task, **wanted)
        policy.save()
    elif any(_differs(getattr(policy, field), value) for field, value in wanted.items()):
        for field, value in wanted.items():
            setattr(policy, field, value)
        policy.save()
        policy_updated = True
    policy.periodic_task = task
    policies.note_timing_change(policy)
    if created:
        return "created"
    return "updated" if task_updated or policy_updated else "unchanged"


def _differs(current: Any, wanted: Any) -> bool:
    if hasattr(current, "pk") or hasattr(wanted, "pk"):
        return getattr(current, "pk", None) != getattr(wanted, "pk", None)
    if isinstance(current, str) and isinstance(wanted, str) and current.startswith("{"):
        try:
            return json.loads(current) != json.loads(wanted)
        except ValueError:
            return current != wanted
    return current != wanted


__all__ = [
    "Declaration",
    "SyncReport",
    "apply_policy",
    "declare",
    "declared",
    "make",
    "schedule_row",
    "sync",
]
