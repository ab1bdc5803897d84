"""The Django Tasks backend (scheduling.backends) on real PostgreSQL, in Django's own vocabulary.

Tasks run in the test's process through ``scheduling.testing.run_due`` (the real claim and runner);
``tests/e2e/backends/test_backends_worker.py`` runs them on a real worker.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from scheduling import api, backends, exceptions, registry, testing
from scheduling.backends import InvalidTask, TaskResultDoesNotExist, TaskResultStatus
from scheduling.models import JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.taskkit import tasks

try:
    from django.tasks import default_task_backend, signals, task_backends
    from django.tasks.exceptions import TaskResultMismatch
except ImportError:  # Django 5.2: the backport
    from django_tasks import default_task_backend, signals, task_backends
    from django_tasks.exceptions import TaskResultMismatch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent():
    """Every task signal sent during the test, as (signal name, status, result id)."""
    seen: list[tuple[str, str, str]] = []
    receivers = {}
    for name in ("task_enqueued", "task_started", "task_finished"):

        def receiver(sender, task_result, name=name, **kwargs):
            seen.append((name, str(task_result.status), task_result.id))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield seen
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_the_setting_gives_timekeepers_backend_with_every_feature():
    """TASKS["default"] is TimekeeperBackend, and it supports defer, get_result, priority and async tasks."""
    backend = task_backends["default"]
    assert isinstance(backend, backends.TimekeeperBackend)
    assert (backend.supports_defer, backend.supports_get_result, backend.supports_priority) == (True, True, True)
    assert backend.supports_async_task is True
    assert default_task_backend.alias == "default"


def test_enqueue_writes_a_row_in_the_callers_transaction(sent):
    """enqueue is a pending due_at row of the task's kind, READY, gone with a rollback; task_enqueued is sent."""
    with transaction.atomic():
        tasks.add.enqueue(1, 2)
        assert ScheduledJob.objects.filter(kind="tests.taskkit.tasks.add").count() == 1
        transaction.set_rollback(True)
    assert not ScheduledJob.objects.filter(kind="tests.taskkit.tasks.add").exists()
    sent.clear()
    result = tasks.add.enqueue(2, b=3)
    job = ScheduledJob.objects.get(task_result_id=result.id)
    assert (job.kind, job.state, job.priority) == ("tests.taskkit.tasks.add", JobState.PENDING, 0)
    assert job.payload == {"args": [2], "kwargs": {"b": 3}, "queue_name": "default", "priority": 0}
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert result.enqueued_at == job.created_at
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None, None, None)
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert sent == [("task_enqueued", "READY", result.id)]
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_run_keeps_the_return_value_and_fills_the_result(sent):
    """The worker's run: RUNNING then SUCCESSFUL signals, the JSON return value, times, one worker id."""
    result = tasks.add.enqueue(2, 3)
    sent.clear()
    report = testing.run_due()
    assert (report.started, report.succeeded) == (1, 1)
    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert ScheduledJob.objects.get(task_result_id=result.id).return_value == 5
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert done.last_attempted_at == done.started_at
    assert done.attempts == 1
    assert len(done.worker_ids) == 1
    assert done.worker_ids[0]
    assert done.errors == []
    assert sent == [("task_started", "RUNNING", result.id), ("task_finished", "SUCCESSFUL", result.id)]
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


def test_failures_are_retried_with_one_error_per_attempt_and_the_context_counts_them(sent):
    """A task failing twice: READY between attempts, then SUCCESSFUL with two TaskErrors; context.attempt is 1, 2, 3."""
    result = tasks.flaky.enqueue(fail_until=3)
    testing.run_due(max_rounds=1)
    between = backends.TimekeeperBackend.get_result(task_backends["default"], result.id)
    assert between.status == TaskResultStatus.READY
    assert [e.exception_class_path for e in between.errors] == ["builtins.ValueError"]
    testing.run_due(include_future=True)
    done = tasks.flaky.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"attempt": 3, "id": result.id, "status": "RUNNING"}
    assert done.attempts == 3
    assert [e.exception_class for e in done.errors] == [ValueError, ValueError]
    assert "ValueError" in done.errors[0].traceback
    assert "in flaky" in done.errors[0].traceback
    assert [s for s, _, _ in sent if s != "task_enqueued"] == ["task_started", "task_finished"] * 3
    assert [status for s, status, _ in sent if s == "task_finished"] == ["FAILED", "FAILED", "SUCCESSFUL"]


def test_a_task_out_of_attempts_is_failed():
    """max_attempts per call: one failure is FAILED, return_value raises, the error names the exception class."""
    result = tasks.flaky.options(max_attempts=1).enqueue(fail_until=99)
    assert ScheduledJob.objects.get(task_result_id=result.id).max_attempts == 1
    testing.run_due()
    failed = tasks.flaky.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.is_finished
    assert failed.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value
    assert [e.exception_class for e in failed.errors] == [ValueError]
    assert ScheduledJob.objects.get(task_result_id=result.id).state == JobState.DEAD


def test_a_coroutine_task_runs_on_the_worker():
    """An async def task is supported: the worker runs the coroutine and keeps its value."""
    result = tasks.async_double.enqueue(21)
    testing.run_due()
    assert tasks.async_double.get_result(result.id).return_value == 42


def test_a_return_value_json_cannot_hold_fails_the_task():
    """Returning an object JSON cannot hold fails the attempt with TypeError; nothing is kept."""
    result = tasks.not_json.options(max_attempts=1).enqueue()
    testing.run_due()
    failed = tasks.not_json.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["builtins.TypeError"]
    assert ScheduledJob.objects.get(task_result_id=result.id).return_value is None


@pytest.mark.parametrize(("which", "says"), [("nan", "NaN or Infinity"), ("nul", "NUL"), ("surrogate", "surrogate")])
def test_a_return_value_postgresql_cannot_store_fails_the_task_with_the_reason(which, says):
    """NaN, a NUL, a lone surrogate: a named InvalidPayload before the write (it was the database's DataError)."""
    result = tasks.unstorable.options(max_attempts=1).enqueue(which)
    testing.run_due()
    failed = tasks.unstorable.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [exceptions.InvalidPayload]
    assert says in failed.errors[0].traceback
    assert ScheduledJob.objects.get(task_result_id=result.id).return_value is None


def test_a_priority_that_is_not_a_whole_number_is_refused_when_the_task_is_made():
    """True passed Django's range check (a bool is an int) and every enqueue then failed; 5.0 was stored as a float."""
    for priority in (True, 5.0, "5"):  # "5": the backport compared it with its range first (a TypeError)
        with pytest.raises(InvalidTask, match="priority must be a whole number"):
            tasks.text_of.using(priority=priority)


def test_the_task_timeout_stops_it_and_names_job_timeout():
    """A task past its per-task timeout (1 s) is stopped: FAILED with scheduling.core.executor.JobTimeout."""
    result = tasks.sleepy.enqueue(30)
    testing.run_due()
    failed = tasks.sleepy.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["scheduling.core.executor.JobTimeout"]
    assert registry.get("tests.taskkit.tasks.sleepy").atomic is False


def test_an_atomic_task_commits_its_effect_with_its_value():
    """An atomic task's database write and its return value are both there after the run, once."""
    result = tasks.record.enqueue("once")
    testing.run_due()
    done = tasks.record.get_result(result.id)
    assert Execution.objects.filter(idempotency_key="once").count() == 1
    assert done.return_value["execution"] == Execution.objects.get(idempotency_key="once").id


def test_run_after_is_the_due_time_and_must_be_aware():
    """run_after becomes due_at (the job waits for it); a naive run_after is InvalidTask and stores nothing."""
    later = timezone.now() + dt.timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 1)
    job = ScheduledJob.objects.get(task_result_id=result.id)
    assert abs(job.due_at - later) < dt.timedelta(milliseconds=1)
    assert testing.run_due().started == 0
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=dt.datetime(2030, 1, 1, 9, 0)).enqueue(1, 1)
    assert ScheduledJob.objects.filter(kind="tests.taskkit.tasks.add").count() == 1


def test_an_unknown_queue_and_a_priority_out_of_range_are_invalid():
    """queue_name must be one of QUEUES and priority within -100..100: InvalidTask, as Django says."""
    with pytest.raises(InvalidTask, match="Queue 'reports' is not valid"):
        tasks.add.using(queue_name="reports")
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101)
    with override_settings(
        TASKS={"default": {"BACKEND": "scheduling.backends.TimekeeperBackend", "QUEUES": ["default", "reports"]}}
    ):
        result = tasks.add.using(queue_name="reports").enqueue(1, 2)
        assert ScheduledJob.objects.get(task_result_id=result.id).payload["queue_name"] == "reports"
        assert tasks.add.get_result(result.id).task.queue_name == "reports"


def test_a_using_copy_changes_its_own_call_not_the_kind():
    """using(queue_name=, priority=) is this call's: the kind keeps the declared queue (the claim routes every job
    of the kind by it) and the declared task stays the kind's, made or enqueued or not."""
    kind = "tests.taskkit.tasks.add"
    with override_settings(
        TASKS={"default": {"BACKEND": "scheduling.backends.TimekeeperBackend", "QUEUES": ["default", "reports"]}}
    ):
        tasks.add.using(queue_name="reports", priority=80)  # made, never enqueued
        assert (registry.get(kind).queue, backends.task_for(kind)) == ("default", tasks.add)
        result = tasks.add.using(queue_name="reports").enqueue(1, 2)
        assert ScheduledJob.objects.get(task_result_id=result.id).payload["queue_name"] == "reports"
        assert (registry.get(kind).queue, backends.task_for(kind).priority) == ("default", tasks.add.priority)


def test_a_task_declared_again_with_another_queue_is_the_kind_and_a_using_copy_made_before_is_not():
    """The same function decorated again with only another queue_name is a new declaration: it wins (it looked
    like a using() copy and the kind kept the first queue). A using() copy, enqueued later, still changes nothing."""
    kind = "tests.taskkit.tasks.add"
    with override_settings(
        TASKS={"default": {"BACKEND": "scheduling.backends.TimekeeperBackend", "QUEUES": ["default", "reports"]}}
    ):
        copy = tasks.add.using(queue_name="default", priority=10)
        try:
            again = backends.task(queue_name="reports")(tasks.add.func)
            assert (registry.get(kind).queue, backends.task_for(kind)) == ("reports", again)
            copy.enqueue(1, 2)
            assert (registry.get(kind).queue, backends.task_for(kind)) == ("reports", again)
        finally:
            backends.task()(tasks.add.func)  # declared as tests/taskkit declares it
        assert (registry.get(kind).queue, backends.task_for(kind)) == ("default", tasks.add)
        assert copy.using_copy
        assert not backends.task_for(kind).using_copy


def test_django_priority_maps_onto_the_claim_order():
    """-100..0 -> 0 (the default), 1..100 -> ceil(p*9/100): monotone, 100 -> 9; the row gets the mapped priority."""
    mapped = [backends.job_priority(p) for p in range(-100, 101)]
    assert mapped == sorted(mapped)
    assert {p: backends.job_priority(p) for p in (-100, -1, 0, 1, 11, 12, 50, 89, 100)} == {
        -100: 0,
        -1: 0,
        0: 0,
        1: 1,
        11: 1,
        12: 2,
        50: 5,
        89: 9,
        100: 9,
    }
    result = tasks.record.enqueue("prio")  # @task(priority=50)
    assert ScheduledJob.objects.get(task_result_id=result.id).priority == 5
    assert tasks.record.get_result(result.id).task.priority == 50


def test_higher_priority_tasks_are_claimed_first():
    """Among due tasks, Django priority 100 is claimed before priority 0 (the claim's order)."""
    low = tasks.add.enqueue(0, 0)
    high = tasks.add.using(priority=100).enqueue(0, 1)
    from scheduling.due_at import store

    (first,) = store.claim_due_jobs(1)
    assert first.id == backends.task_job(high).pk
    assert backends.task_job(low).pk in testing.run_due().job_ids


def test_unknown_ids_and_other_jobs_are_not_task_results():
    """TaskResultDoesNotExist for a missing id, a non-number and a job of a plain kind; another task's id mismatches."""
    backend = task_backends["default"]
    plain = api.schedule("demo.record", {"label": "x"}, delay=60)
    for missing in ("999999999", "not-a-number", str(plain.id)):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)
    added = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.flaky.get_result(added.id)
    assert async_to_sync(backend.aget_result)(added.id).id == added.id
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(backend.aget_result)("999999999")


def test_cancel_and_reschedule_go_through_scheduling_api():
    """A READY task can be cancelled (FAILED, never runs) or moved; a finished one is not cancellable."""
    moved = tasks.add.enqueue(1, 1)
    later = timezone.now() + dt.timedelta(days=1)
    assert abs(backends.reschedule(moved, later) - later) < dt.timedelta(milliseconds=1)
    cancelled = tasks.add.enqueue(2, 2)
    assert backends.cancel(cancelled) == backends.task_job(cancelled).pk
    assert testing.run_due().started == 0
    assert tasks.add.get_result(cancelled.id).status == TaskResultStatus.FAILED
    assert ScheduledJob.objects.get(task_result_id=cancelled.id).state == JobState.CANCELLED
    ran = tasks.add.enqueue(3, 3)
    testing.run_due()
    with pytest.raises(exceptions.JobNotCancellable):
        backends.cancel(ran.id)


def test_a_task_cancelled_after_a_failed_attempt_finished_when_it_was_cancelled():
    """A failed attempt leaves the task READY for its retry; a cancel then ends it: finished_at is the
    cancel's time (the row's), not the end of the failed attempt before it."""
    result = tasks.flaky.enqueue(fail_until=99)
    testing.run_due(max_rounds=1)
    row = ScheduledJob.objects.get(task_result_id=result.id)
    assert row.state == JobState.PENDING
    (attempt_end,) = JobAttempt.objects.filter(job=row).values_list("finished_at", flat=True)
    backends.cancel(result)
    row.refresh_from_db()
    cancelled = tasks.flaky.get_result(result.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.finished_at == row.finished_at
    assert cancelled.finished_at > attempt_end
    assert [e.exception_class for e in cancelled.errors] == [ValueError]


def test_per_call_keys_replace_keep_or_refuse():
    """options(key=...): a second enqueue replaces the pending task, or keeps it, or raises KeyConflict."""
    first = tasks.add.options(key="sum:1").enqueue(1, 1)
    replaced = tasks.add.options(key="sum:1").enqueue(1, 2)
    assert replaced.id == first.id
    assert replaced.args == [1, 2]
    kept = tasks.add.options(key="sum:1", on_conflict="keep").enqueue(9, 9)
    assert kept.args == [1, 2]
    with pytest.raises(exceptions.KeyConflict):
        tasks.add.options(key="sum:1", on_conflict="error").enqueue(3, 3)
    assert ScheduledJob.objects.filter(key="sum:1").count() == 1
    with pytest.raises(InvalidTask, match="on_conflict"):
        tasks.add.options(key="sum:2", on_conflict="merge")
    with pytest.raises(InvalidTask, match="api"):
        tasks.add.options(api=registry.Access())


def test_per_task_options_make_the_kind_contract():
    """@backends.task(max_attempts=, timeout=, atomic=, api=) are the kind's; plain @task gets the defaults."""
    sleepy, open_kind, plain = (registry.get(f"tests.taskkit.tasks.{n}") for n in ("sleepy", "open_to_users", "add"))
    assert (sleepy.max_attempts, sleepy.timeout_seconds, sleepy.atomic) == (1, 1.0, False)
    assert open_kind.max_attempts == 2
    assert (plain.max_attempts, plain.atomic, plain.api) == (5, True, None)
    with pytest.raises(InvalidTask, match="Unknown task options"):
        backends.task(retries=3)(tasks.add.func)


def test_a_task_is_api_schedulable_only_when_it_says_who_may():
    """The doors ask the kind: a plain @task is closed to API users; api=registry.Access() opens it."""
    user = User.objects.create_user("ada", password="pw")
    payload = {"args": ["hi"], "kwargs": {}}
    assert registry.get("tests.taskkit.tasks.add").allows(user, payload) is False
    assert registry.get("tests.taskkit.tasks.open_to_users").allows(user, payload) is True


def test_a_tasks_rate_option_reaches_the_kinds_rate_limit():
    """@backends.task(rate="2/h"): the kind's rate is 2 an hour and of three enqueued tasks two start."""
    assert registry.get("tests.taskkit.tasks.rated").rate == registry.Rate(2, 3600.0)
    results = [tasks.rated.enqueue(n) for n in range(3)]
    assert testing.run_due().started == 2
    statuses = sorted(str(tasks.rated.get_result(r.id).status) for r in results)
    assert statuses == sorted([str(TaskResultStatus.SUCCESSFUL)] * 2 + [str(TaskResultStatus.READY)])


def test_pause_holds_tasks_and_resume_lets_them_run():
    """A task's kind can be paused like any kind: its due task stays READY until resumed."""
    result = tasks.add.enqueue(4, 4)
    api.pause("tests.taskkit.tasks.add")
    assert testing.run_due().started == 0
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY
    api.resume("tests.taskkit.tasks.add")
    assert testing.run_due().succeeded == 1
    assert tasks.add.get_result(result.id).return_value == 8


def test_a_reclaimed_attempt_is_a_worker_lost_error(run_sql):
    """A claim taken back from a dead worker shows as a TaskError of scheduling.backends.WorkerLost."""
    from scheduling.due_at import store, sweep

    result = tasks.add.enqueue(5, 5)
    (claim,) = store.claim_due_jobs(10)
    store.start_jobs([(claim.id, claim.token)], "dead:1")
    assert tasks.add.get_result(result.id).status == TaskResultStatus.RUNNING
    assert tasks.add.get_result(result.id).worker_ids == ["dead:1"]
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", [claim.id])
    assert sweep.reclaim_expired() == (1, 0)
    again = tasks.add.get_result(result.id)
    assert again.status == TaskResultStatus.READY
    assert [e.exception_class for e in again.errors] == [backends.WorkerLost]
    testing.run_due(include_future=True)
    assert tasks.add.get_result(result.id).return_value == 10
    assert tasks.add.get_result(result.id).attempts == 2


def test_the_backend_check_names_bad_queues_and_options():
    """scheduling.E009: a Timekeeper TASKS entry with a queue that is no name, or with OPTIONS it does not read."""
    bad = backends.TimekeeperBackend("bad", {"QUEUES": ["default", ""], "OPTIONS": {"retries": 3}})
    assert [m.id for m in bad.check()] == ["scheduling.E009", "scheduling.E009"]
    assert list(task_backends["default"].check()) == []


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="the backport's app matters only before Django 6.0")
def test_the_backport_missing_from_installed_apps_is_a_warning():
    """scheduling.W006: on Django 5.2, TASKS with Timekeeper's backend and no 'django_tasks' app."""
    from scheduling import checks as scheduling_checks

    assert scheduling_checks.check_tasks_backport() == []
    without = [app for app in settings.INSTALLED_APPS if app != "django_tasks"]
    with override_settings(INSTALLED_APPS=without):
        assert [m.id for m in scheduling_checks.check_tasks_backport()] == ["scheduling.W006"]


def test_a_cap_on_the_tasks_kind_limits_how_many_are_claimed():
    """api.set_max_running on a task's kind: of two due tasks one is claimed, the other waits READY."""
    from scheduling.due_at import store

    first, second = tasks.add.enqueue(1, 0), tasks.add.enqueue(2, 0)
    api.set_max_running("tests.taskkit.tasks.add", 1)
    assert len(store.claim_due_jobs(10)) == 1
    assert store.claim_due_jobs(10) == []
    statuses = {tasks.add.get_result(r.id).status for r in (first, second)}
    assert statuses == {TaskResultStatus.READY}  # claimed but not started is still READY
    assert ScheduledJob.objects.filter(kind="tests.taskkit.tasks.add", state=JobState.PENDING).count() == 1


# --- Issue 33: opaque ids, bounds, queues, module paths, errors, the enqueued task -------------------


def test_result_ids_are_random_and_no_other_id_shape_is_a_result():
    """A result id is a UUID, not the job's number; the job's number, junk, an unknown UUID: TaskResultDoesNotExist."""
    import uuid

    backend = task_backends["default"]
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    rows = [ScheduledJob.objects.get(task_result_id=r.id) for r in (first, second)]
    assert [str(uuid.UUID(r.id)) for r in (first, second)] == [first.id, second.id]
    assert {first.id, second.id}.isdisjoint({str(row.pk) for row in rows})
    for other in (str(rows[0].pk), str(rows[0].pk + 1), "not-a-uuid", "", str(uuid.uuid4())):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(other)
    assert backend.get_result(second.id).args == [2, 2]


def test_a_job_that_is_no_task_is_no_result_and_cannot_be_cancelled_or_moved_as_one():
    """A plain job, even one with a result id (the backfill's), is TaskResultDoesNotExist to get, cancel, move."""
    import uuid

    plain = api.schedule("demo.record", {"label": "system"}, delay=60)
    ScheduledJob.objects.filter(pk=plain.pk).update(task_result_id=uuid.uuid4())
    result_id = str(ScheduledJob.objects.get(pk=plain.pk).task_result_id)
    later = timezone.now() + dt.timedelta(days=1)
    for other in (str(plain.pk), result_id):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(other)
        with pytest.raises(TaskResultDoesNotExist):
            backends.cancel(other)
        with pytest.raises(TaskResultDoesNotExist):
            backends.reschedule(other, later)
    stored = ScheduledJob.objects.get(pk=plain.pk)
    assert (stored.state, stored.due_at) == (JobState.PENDING, plain.due_at)


def test_owned_result_answers_the_owner_only_and_the_context_names_the_owner():
    """owned_result(id, user): the owner's task only (another user's is TaskResultDoesNotExist); context.owner_id."""
    alice = User.objects.create_user("alice-tasks", password="pw")
    bob = User.objects.create_user("bob-tasks", password="pw")
    mine = tasks.whose.options(owner=alice).enqueue()
    system = tasks.whose.enqueue()
    assert backends.owned_result(mine.id, alice).id == mine.id
    assert backends.owned_result(system.id, None).id == system.id
    for result_id, user in ((mine.id, bob), (mine.id, None), (system.id, alice)):
        with pytest.raises(TaskResultDoesNotExist):
            backends.owned_result(result_id, user)
    testing.run_due()
    assert backends.owned_result(mine.id, alice).return_value == {"owner_id": alice.pk, "id": mine.id}
    assert tasks.whose.get_result(system.id).return_value == {"owner_id": None, "id": system.id}


def test_a_task_scheduled_through_the_json_api_gets_a_signed_result_id_at_its_run():
    """A task job made by api.schedule (the JSON API's door) runs with signed_result_id(job id), stable across reads."""
    job = api.schedule("tests.taskkit.tasks.whose", {"args": [], "kwargs": {}}, delay=0)
    assert ScheduledJob.objects.get(pk=job.pk).task_result_id is None
    testing.run_due()
    expected = str(backends.signed_result_id(job.pk))
    assert str(ScheduledJob.objects.get(pk=job.pk).task_result_id) == expected
    assert tasks.whose.get_result(expected).return_value == {"owner_id": None, "id": expected}


@override_settings(SCHEDULING_MAX_RETURN_VALUE_BYTES=1000)
def test_a_return_value_over_the_bound_fails_the_attempt_and_stores_nothing():
    """Over SCHEDULING_MAX_RETURN_VALUE_BYTES: FAILED with ReturnValueTooLarge naming the setting; at it, kept."""
    over = tasks.text_of.options(max_attempts=1).enqueue(2000)
    under = tasks.text_of.enqueue(900)
    testing.run_due()
    failed = tasks.text_of.get_result(over.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [exceptions.ReturnValueTooLarge]
    assert "SCHEDULING_MAX_RETURN_VALUE_BYTES (1000)" in failed.errors[0].traceback
    assert ScheduledJob.objects.get(task_result_id=over.id).return_value is None
    assert tasks.text_of.get_result(under.id).return_value == "x" * 900


def test_the_jobs_api_and_the_admin_do_not_read_return_values():
    """GET /api/jobs/, /api/jobs/<id>, the admin's list and job page: no SELECT reads return_value."""
    from django.contrib.auth.models import Permission
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    staff = User.objects.create_user("viewer", password="pw", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_scheduledjob", "change_scheduledjob"]))
    result = tasks.text_of.options(owner=staff).enqueue(50_000)
    testing.run_due()
    job = ScheduledJob.objects.get(task_result_id=result.id)
    assert len(job.return_value) == 50_000
    client = Client()
    client.force_login(staff)
    pages = ["/api/jobs/", f"/api/jobs/{job.pk}", "/admin/scheduling/scheduledjob/"]
    pages.append(f"/admin/scheduling/scheduledjob/{job.pk}/change/")
    for page in pages:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(page).status_code == 200, page
        reads = [q["sql"] for q in queries.captured_queries if "return_value" in q["sql"]]
        assert reads == [], (page, reads)


def test_the_json_api_refuses_a_task_queue_outside_queues():
    """POST /api/jobs/ of a task with queue_name not in QUEUES: 400, nothing stored; a queue in QUEUES: 201."""
    import json

    from django.test import Client

    user = User.objects.create_user("api-user", password="pw")
    client = Client()
    client.force_login(user)

    def post(queue: str) -> Any:
        payload = {"args": ["hi"], "kwargs": {}, "queue_name": queue}
        body = {"kind": "tests.taskkit.tasks.open_to_users", "payload": payload, "delay": 0}
        return client.post("/api/jobs/", json.dumps(body), content_type="application/json")

    refused = post("reports")
    assert refused.status_code == 400, refused.content
    assert not ScheduledJob.objects.filter(kind="tests.taskkit.tasks.open_to_users").exists()
    accepted = post("default")
    assert accepted.status_code == 201, accepted.content


def test_a_stored_job_with_a_queue_no_longer_in_queues_reads_and_runs():
    """A task stored on a queue since removed from QUEUES: get_result answers (no InvalidTask) and it runs."""
    queues = {"default": {"BACKEND": "scheduling.backends.TimekeeperBackend", "QUEUES": ["default", "reports"]}}
    with override_settings(TASKS=queues):
        result = tasks.add.using(queue_name="reports").enqueue(3, 4)
    read = task_backends["default"].get_result(result.id)
    assert (read.status, read.task.queue_name) == (TaskResultStatus.READY, "reports")
    testing.run_due()
    assert tasks.add.get_result(result.id).return_value == 7


def _forget(module_name: str) -> None:
    """This process forgets a task module: its tasks, their kinds, the module itself."""
    import sys

    from scheduling.core import registry as core_registry

    for name in [n for n in backends._tasks if n.startswith(f"{module_name}.")]:
        backends._tasks.pop(name)
        core_registry._kinds.pop(name, None)
    sys.modules.pop(module_name, None)


def test_a_task_is_found_by_its_module_path_where_no_one_imported_it():
    """A task of a module under a handler package, forgotten by this process, still runs: found by its path."""
    from tests.taskkit.lazy import async_tasks

    with override_settings(SCHEDULING_HANDLER_PACKAGES=["tests.taskkit"]):
        result = async_tasks.ping.enqueue("found")
        _forget("tests.taskkit.lazy.async_tasks")
        assert testing.run_due().succeeded == 1
        done = task_backends["default"].get_result(result.id)
    assert (done.status, done.return_value["label"]) == (TaskResultStatus.SUCCESSFUL, "found")


def test_only_tasks_of_this_backend_under_installed_apps_are_found_by_path():
    """No module outside the installed apps and handler packages is imported; a plain function is no task."""
    import sys

    _forget("tests.taskkit.lazy.async_tasks")
    assert backends.task_for("tests.taskkit.lazy.async_tasks.ping") is None  # tests.taskkit: not an app here
    assert "tests.taskkit.lazy.async_tasks" not in sys.modules
    assert "this" not in sys.modules  # the stdlib's module that prints when imported
    assert backends.task_for("this.d") is None
    assert "this" not in sys.modules
    with override_settings(SCHEDULING_HANDLER_PACKAGES=["tests.taskkit"]):
        assert backends.task_for("tests.taskkit.lazy.async_tasks.not_a_task") is None
        assert backends.task_for("tests.taskkit.lazy.async_tasks.ping") is not None
    with pytest.raises(exceptions.UnknownJobKind):
        registry.get("tasks.models.Execution")


def test_a_failed_tasks_traceback_is_whole_as_djangos():
    """TaskError.traceback is Django's text: frames and the last line "ValueError: <message>"."""
    result = tasks.flaky.options(max_attempts=1).enqueue(fail_until=9)
    testing.run_due()
    (error,) = tasks.flaky.get_result(result.id).errors
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert error.traceback.endswith("ValueError: attempt 1 fails on purpose\n")
    assert "in flaky" in error.traceback
    assert error.exception_class is ValueError


def test_result_task_is_the_task_enqueued():
    """result.task == the task enqueued, from enqueue and from get_result, with and without run_after or priority."""
    later = timezone.now() + dt.timedelta(hours=1)
    for enqueued in (tasks.add, tasks.add.using(run_after=later), tasks.add.using(priority=30), tasks.record):
        result = enqueued.enqueue(*([1, 2] if enqueued.func is tasks.add.func else ["same"]))
        assert result.task == enqueued
        assert task_backends["default"].get_result(result.id).task == enqueued


@override_settings(USE_TZ=False)
def test_enqueue_with_use_tz_off_is_refused_and_stores_nothing():
    """USE_TZ = False: enqueue raises InvalidTask before anything is stored."""
    with pytest.raises(InvalidTask, match="USE_TZ"):
        tasks.add.enqueue(1, 2)
    assert not ScheduledJob.objects.filter(kind="tests.taskkit.tasks.add").exists()


def test_a_refusal_after_the_row_was_written_rolls_it_back():
    """A failure inside enqueue after the insert (here: the result read) leaves no row, in autocommit."""
    original = backends.TimekeeperBackend._read_row

    def broken(self: Any, row: Any, enqueued: Any, **kwargs: Any) -> Any:
        raise InvalidTask("refused late")

    backends.TimekeeperBackend._read_row = broken  # type: ignore[method-assign]
    try:
        with pytest.raises(InvalidTask, match="refused late"):
            tasks.add.enqueue(1, 2)
    finally:
        backends.TimekeeperBackend._read_row = original  # type: ignore[method-assign]
    assert not ScheduledJob.objects.filter(kind="tests.taskkit.tasks.add").exists()


def test_a_tasks_own_sys_exit_and_keyboard_interrupt_are_its_failures():
    """sys.exit() and KeyboardInterrupt in a task: FAILED with that class and Django's traceback; run_due returns."""
    exited = tasks.exits.options(max_attempts=1).enqueue("in-process")
    interrupted = tasks.interrupted.options(max_attempts=1).enqueue()
    report = testing.run_due()
    assert (report.started, report.failed) == (2, 2)
    (exit_error,) = tasks.exits.get_result(exited.id).errors
    assert exit_error.exception_class is SystemExit
    assert exit_error.traceback.endswith("SystemExit: 3\n")
    (interrupt_error,) = tasks.interrupted.get_result(interrupted.id).errors
    assert interrupt_error.exception_class is KeyboardInterrupt
    assert interrupt_error.traceback.endswith("KeyboardInterrupt: the task's own interrupt\n")


def test_a_claim_given_back_by_a_shutdown_is_no_error_while_the_task_will_run_again():
    """A stopping worker's release: READY with no WorkerLost error; on the last attempt (dead) it is the error."""
    from scheduling.due_at import runner, store

    again = tasks.add.enqueue(1, 1)
    last = tasks.add.options(max_attempts=1).enqueue(2, 2)
    claims = store.claim_due_jobs(10)
    store.start_jobs([(c.id, c.token) for c in claims], "stopping:1")
    store.release_jobs([(c.id, c.token) for c in claims], runner.RELEASE_REASON)
    retried = tasks.add.get_result(again.id)
    assert (retried.status, retried.errors) == (TaskResultStatus.READY, [])
    dead = tasks.add.get_result(last.id)
    assert dead.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in dead.errors] == [backends.WorkerLost]
