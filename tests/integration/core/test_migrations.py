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


KEYS_BEFORE = ("scheduling", "0008_schedulepolicy_suspended_disables_task")
KEYS_AFTER = ("scheduling", "0009_scheduledjob_key_unique_among_waiting_jobs")


def _keyed_row(state: str, attempts: int, claimed_by: str = "") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO scheduling_scheduledjob (kind, payload, due_at, state, lease_seconds, attempts, max_attempts,"
            " last_error, key, claimed_by, token, claimed_at, priority)"
            " VALUES ('demo.noop', '{}', now(), %(state)s, 30, %(attempts)s, 5, '', 'acct:1', %(by)s,"
            " CASE WHEN %(state)s = 'claimed' THEN gen_random_uuid() END,"
            " CASE WHEN %(state)s = 'claimed' THEN now() END, 0)",
            {"state": state, "attempts": attempts, "by": claimed_by},
        )


def test_0009_keeps_rows_that_fit_and_lets_a_successor_wait_beside_a_running_job():
    """Rows valid under the old key index migrate; afterwards a running job and a waiting successor share a key."""
    _migrate(KEYS_BEFORE)
    _keyed_row("claimed", 1, claimed_by="worker:1")
    _migrate(KEYS_AFTER)
    _keyed_row("pending", 0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT state FROM scheduling_scheduledjob WHERE key = 'acct:1' ORDER BY id")
        assert [r[0] for r in cursor.fetchall()] == ["claimed", "pending"]
        cursor.execute("DELETE FROM scheduling_scheduledjob")


def test_0009_refuses_rows_the_new_index_would_reject_and_names_their_key():
    """Two waiting jobs of one key (old index dropped by hand): the migration stops, naming the key."""
    _migrate(KEYS_BEFORE)
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX scheduledjob_live_owner_key_uniq")
    _keyed_row("pending", 0)
    _keyed_row("claimed", 1)
    with pytest.raises(RuntimeError, match="acct:1"):
        _migrate(KEYS_AFTER)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM scheduling_scheduledjob")
        cursor.execute(
            "CREATE UNIQUE INDEX scheduledjob_live_owner_key_uniq ON scheduling_scheduledjob"
            " ((coalesce(owner_id, 0)), key) WHERE key IS NOT NULL AND state IN ('pending', 'claimed')"
        )


def _owner_indexes() -> dict[str, list[str]]:
    """Each owner-bearing table's indexes whose first column is owner_id, and its foreign keys on owner_id."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT t.relname, i.relname FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid"
            " JOIN pg_class AS t ON t.oid = x.indrelid JOIN pg_attribute AS a ON a.attrelid = t.oid"
            " AND a.attnum = x.indkey[0] WHERE t.relname IN ('scheduling_scheduledjob', 'scheduling_recurrence')"
            " AND a.attname = 'owner_id' UNION ALL SELECT t.relname, c.conname FROM pg_constraint AS c"
            " JOIN pg_class AS t ON t.oid = c.conrelid WHERE c.contype = 'f' AND t.relname IN"
            " ('scheduling_scheduledjob', 'scheduling_recurrence') AND c.conname LIKE '%%owner_id%%'"
        )
        found: dict[str, list[str]] = {}
        for table, name in cur.fetchall():
            found.setdefault(table, []).append(name)
    return {table: sorted(names) for table, names in found.items()}


def test_0020_drops_only_the_owner_indexes_that_owner_state_covers_and_keeps_the_foreign_keys():
    """After 0020 each table keeps its (owner, state) index and its foreign key; back to 0019 the index returns."""
    # 0029 adds the jobs list's (owner, due_at, id) index; going back to 0019 removes it again.
    after = _owner_indexes()
    assert after == {
        "scheduling_recurrence": [
            "recurrence_owner_state_idx",
            "scheduling_recurrence_owner_id_e867d6fb_fk_auth_user_id",
        ],
        "scheduling_scheduledjob": [
            "scheduledjob_owner_due_idx",
            "scheduledjob_owner_state_idx",
            "scheduling_scheduledjob_owner_id_84d233e4_fk_auth_user_id",
        ],
    }
    after["scheduling_scheduledjob"].remove("scheduledjob_owner_due_idx")
    _migrate(("scheduling", "0019_jobs_and_attempts_autovacuum_settings"))
    before = _owner_indexes()
    assert before["scheduling_recurrence"] == sorted(
        [*after["scheduling_recurrence"], "scheduling_recurrence_owner_id_e867d6fb"]
    )
    assert before["scheduling_scheduledjob"] == sorted(
        [*after["scheduling_scheduledjob"], "scheduling_scheduledjob_owner_id_84d233e4"]
    )


def test_0025_gives_stored_task_jobs_a_random_result_id_and_other_jobs_none():
    """Back to 0022, task-shaped and plain jobs; after 0025 each task job has its own UUID, the plain job none."""
    import uuid

    from django.utils import timezone

    before = _migrate(("scheduling", "0022_count_attempts_through_the_job_key"))
    jobs = before.loader.project_state([("scheduling", "0022_count_attempts_through_the_job_key")]).apps.get_model(
        "scheduling", "ScheduledJob"
    )
    common = {"due_at": timezone.now(), "max_attempts": 5, "lease_seconds": 30}
    tasks = [
        jobs.objects.create(kind="shop.tasks.a", payload={"args": [1], "kwargs": {}}, **common).pk,
        jobs.objects.create(
            kind="shop.tasks.b", payload={"args": [], "kwargs": {}, "queue_name": "default", "priority": 5}, **common
        ).pk,
    ]
    plain = jobs.objects.create(kind="demo.record", payload={"label": "x", "args": []}, **common).pk
    _migrate(("scheduling", "0025_scheduledjob_add_task_result_id"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, task_result_id FROM scheduling_scheduledjob ORDER BY id")
        ids = dict(cursor.fetchall())
    assert ids[plain] is None
    assert all(uuid.UUID(str(ids[pk])).version == 4 for pk in tasks)
    assert ids[tasks[0]] != ids[tasks[1]]
