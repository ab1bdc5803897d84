"""Data migrations run against real rows: migrate back to the step before, make the rows, migrate forward."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("scheduling", "0007_jobattempt_add_traceback")
AFTER = ("scheduling", "0008_schedulepolicy_suspended_disables_task")


def _migrate(target: tuple[str, str]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    return MigrationExecutor(connection)  # a fresh graph: the state the next step starts from


@pytest.fixture(autouse=True)
def back_to_the_latest_schema():
    """Whatever a test migrates to, the database ends at the latest migration of every app, for the tests after it."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_0008_disables_suspended_schedules_and_suspends_disabled_ones():
    """One pause switch: a suspended schedule's task is disabled, a disabled task's policy suspended, others kept."""
    executor = _migrate(BEFORE)
    apps = executor.loader.project_state([BEFORE, ("django_celery_beat", "0019_alter_periodictasks_options")]).apps
    interval = apps.get_model("django_celery_beat", "IntervalSchedule").objects.create(every=1, period="hours")
    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    policy_model = apps.get_model("scheduling", "SchedulePolicy")
    rows = {}
    for name, enabled, suspend in [("suspended", True, True), ("disabled", False, False), ("running", True, False)]:
        task = task_model.objects.create(name=name, task="scheduling.run_fixed", interval=interval, enabled=enabled)
        policy_model.objects.create(periodic_task=task, kind="demo.record", suspend=suspend)
        rows[name] = task.pk

    _migrate(AFTER)

    from django_celery_beat.models import PeriodicTask

    from scheduling.models import SchedulePolicy

    state = {
        name: (PeriodicTask.objects.get(pk=pk).enabled, SchedulePolicy.objects.get(periodic_task_id=pk).suspend)
        for name, pk in rows.items()
    }
    assert state == {"suspended": (False, True), "disabled": (False, True), "running": (True, False)}
