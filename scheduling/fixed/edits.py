"""What a person's edit of a fixed-time schedule means: the admin's door into ``scheduling.fixed``.

A schedule is two rows, django-celery-beat's periodic task and Timekeeper's policy; every edit
keeps them one schedule, here rather than in the admin:

- ``save_task``: the periodic task as posted (its save tells beat).
- ``save_policy``: the policy as posted; its timing written into the task's crontab or interval
  and ``suspend`` kept equal to "not enabled" (``declarations.apply_policy``); the task pointed at
  the gate (``scheduling.run_fixed`` naming itself).
- ``enable``, ``disable``, ``toggle``: the one pause switch ("Enabled") of many tasks at once, each
  policy's ``suspend`` following it, beat told once; they return how many tasks they switched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from django.db import transaction
from django.db.models import Case, Value, When
from django_celery_beat.models import PeriodicTask, PeriodicTasks

from scheduling.core import audit, tasknames
from scheduling.fixed import declarations
from scheduling.fixed import policies as fixed_policies
from scheduling.models import SchedulePolicy


def save_task(task: PeriodicTask) -> None:
    """Save the periodic task as the person's form built it (django-celery-beat's post_save tells beat)."""
    task.save()


def save_policy(
    task: PeriodicTask, policy: SchedulePolicy, *, changed: bool, timezone: str, every_seconds: float | None
) -> None:
    """Save ``policy`` of ``task`` (when new or ``changed``) and make the task follow it, in one transaction."""
    with transaction.atomic():
        if changed or policy.pk is None:
            policy.periodic_task = task
            policy.save()
        declarations.apply_policy(task, policy, timezone, every_seconds)
        point_at_gate(task)


def point_at_gate(task: PeriodicTask) -> bool:
    """A task with a policy runs through the gate: ``scheduling.run_fixed`` naming itself. Whether it was rewritten."""
    wanted = json.dumps({"schedule": task.name})
    if task.task == tasknames.RUN_FIXED and task.kwargs == wanted:
        return False
    task.task = tasknames.RUN_FIXED
    task.kwargs = wanted
    task.save(update_fields=["task", "kwargs"])
    return True


def enable(task_ids: Iterable[int]) -> int:
    """Enable the tasks (and resume their policies); how many tasks were switched."""
    return _switch(task_ids, True)


def disable(task_ids: Iterable[int]) -> int:
    """Disable the tasks (and suspend their policies); their last run time is forgotten, as beat's own action does."""
    return _switch(task_ids, False)


def toggle(task_ids: Iterable[int]) -> int:
    """Flip each task's "Enabled" (its policy's ``suspend`` follows)."""
    return _switch(task_ids, None)


def _switch(task_ids: Iterable[int], enabled: bool | None) -> int:
    ids = sorted({int(task_id) for task_id in task_ids})
    with transaction.atomic():
        tasks = PeriodicTask.objects.filter(pk__in=ids)
        if enabled is None:
            switched = tasks.update(enabled=Case(When(enabled=True, then=Value(False)), default=Value(True)))
        elif enabled:
            switched = tasks.update(enabled=True)
        else:
            switched = tasks.update(enabled=False, last_run_at=None)
        policies = SchedulePolicy.objects.filter(periodic_task__in=ids)
        policies.filter(periodic_task__enabled=True, suspend=True).update(suspend=False)
        policies.filter(periodic_task__enabled=False, suspend=False).update(suspend=True)
        fixed_policies.note_timing_changes(list(policies.values_list("pk", flat=True)))  # update() sends no signal
        PeriodicTasks.update_changed()
        action = "schedule_toggle" if enabled is None else "schedule_enable" if enabled else "schedule_disable"
        names = list(PeriodicTask.objects.filter(pk__in=ids).order_by("name").values_list("name", flat=True)[:20])
        audit.record(action, changed=switched, selected=len(ids), target=", ".join(names), details={"task_ids": ids})
    return switched
