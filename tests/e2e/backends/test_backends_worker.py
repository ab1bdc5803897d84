"""Django's Tasks API end to end: a view enqueues, a real ``celery worker`` runs, the result is read back."""

from __future__ import annotations

import os
import time

import pytest
from django.test import Client

from scheduling.backends import TaskResultStatus
from scheduling.models import JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready
from tests.taskkit import tasks

pytestmark = [pytest.mark.e2e, pytest.mark.urls("tests.taskkit.urls")]

WORKER_ENV = {"DJANGO_SETTINGS_MODULE": "tests.e2e.taskkit_settings"}


def test_a_view_enqueues_the_worker_runs_the_result_reads_back(cluster):
    """enqueue from a view (202 + id), run by the worker (sync, async and atomic tasks), SUCCESSFUL with values."""
    worker = cluster.worker(env=WORKER_ENV)
    wait_ready(worker)
    client = Client()
    ids = {}
    for name, args in (("add", [2, 3]), ("async_double", [21]), ("record", ["from-a-view"])):
        answer = client.post(f"/tasks/{name}/", {"args": args}, content_type="application/json")
        assert answer.status_code == 202, answer.content
        assert answer.json()["status"] == "READY"
        ids[name] = answer.json()["id"]

    def read(name: str) -> dict:
        return client.get(f"/tasks/{name}/{ids[name]}").json()

    for name in ids:
        wait_for(lambda name=name: read(name)["finished"], 60, message=f"the worker to run {name} ({worker.log_path})")
    assert {name: (read(name)["status"], read(name)["attempts"]) for name in ids} == {
        name: ("SUCCESSFUL", 1) for name in ids
    }
    assert read("add")["return_value"] == 5
    assert read("async_double")["return_value"] == 42
    recorded = read("record")["return_value"]
    execution = Execution.objects.get(idempotency_key="from-a-view")
    assert (recorded["execution"], recorded["pid"]) == (execution.id, execution.pid)
    assert execution.pid != os.getpid()  # the worker's pool process ran it, not the test
    (worker_id,) = read("record")["worker_ids"]
    assert worker_id.endswith(f":{execution.pid}")  # host:pid of the pool process that ran it
    result = tasks.add.get_result(ids["add"])
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert ScheduledJob.objects.filter(task_result_id__in=list(ids.values()), state=JobState.DONE).count() == 3


def test_a_cancelled_task_never_runs_on_the_worker(cluster):
    """A task cancelled through scheduling.backends.cancel before its run_after stays FAILED (cancelled), unrun."""
    import datetime as dt

    from django.utils import timezone

    from scheduling import backends

    worker = cluster.worker(env=WORKER_ENV)
    wait_ready(worker)
    cancelled = tasks.record.using(run_after=timezone.now() + dt.timedelta(seconds=2)).enqueue("cancelled")
    control = tasks.record.using(run_after=timezone.now() + dt.timedelta(seconds=2)).enqueue("control")
    backends.cancel(cancelled)
    wait_for(lambda: tasks.record.get_result(control.id).is_finished, 60, message="the control task to run")
    assert tasks.record.get_result(cancelled.id).status == TaskResultStatus.FAILED
    assert list(Execution.objects.values_list("idempotency_key", flat=True)) == ["control"]


def test_a_tasks_own_sys_exit_kills_no_pool_process(cluster):
    """A task calling sys.exit() with 5 attempts: FAILED after 5 SystemExit errors, all run by one pool process."""
    worker = cluster.worker(env=WORKER_ENV, concurrency=1)
    wait_ready(worker)
    result = tasks.exits.options(max_attempts=5).enqueue("sys-exit")
    wait_for(lambda: tasks.exits.get_result(result.id).is_finished, 60, message=f"five attempts ({worker.log_path})")
    failed = tasks.exits.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [SystemExit] * 5
    assert all(e.traceback.endswith("SystemExit: 3\n") for e in failed.errors)
    pids = set(Execution.objects.filter(kind="exits").values_list("pid", flat=True))
    assert len(pids) == 1  # one pool process ran every attempt: none was killed and replaced
    assert "WorkerLostError" not in worker.log_path.read_text()


def test_a_worker_runs_a_task_whose_module_it_never_imported(cluster):
    """tests/taskkit/lazy/async_tasks.py, imported by no worker at start, runs there: found by its module path."""
    from tests.taskkit.lazy import async_tasks

    worker = cluster.worker(env=WORKER_ENV)
    wait_ready(worker)
    result = async_tasks.ping.enqueue("lazy")
    wait_for(lambda: async_tasks.ping.get_result(result.id).is_finished, 60, message=f"the task ({worker.log_path})")
    done = async_tasks.ping.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL, done.errors
    assert done.return_value["label"] == "lazy"
    assert done.return_value["pid"] != os.getpid()


def test_the_worker_meets_the_peers_run_contract(cluster):
    """On a real worker (tests/conformance's run checks): values, async, context, failures with whole tracebacks."""
    from tests.taskkit import conformance as c

    worker = cluster.worker(env=WORKER_ENV)
    wait_ready(worker)
    runs = {
        "value": (c.meaning_of_life, c.meaning_of_life.enqueue()),
        "async": (c.noop_async, c.noop_async.enqueue(1, two=3)),
        "own_id": (c.own_result_id, c.own_result_id.enqueue()),
        "context": (c.reads_its_context, c.reads_its_context.enqueue(1)),
        "value_error": (c.fails_with_value_error, c.fails_with_value_error.enqueue()),
        "system_exit": (c.fails_with_system_exit, c.fails_with_system_exit.enqueue()),
        "sys_exit": (c.calls_sys_exit, c.calls_sys_exit.enqueue()),
        "not_json": (c.returns_what_json_cannot_hold, c.returns_what_json_cannot_hold.enqueue()),
    }

    def read(name: str):
        task, result = runs[name]
        return task.get_result(result.id)

    for name in runs:
        wait_for(lambda name=name: read(name).is_finished, 60, message=f"{name} to finish ({worker.log_path})")
    for name in ("value", "async", "own_id", "context"):
        done = read(name)
        assert (done.status, done.attempts, len(done.worker_ids)) == (TaskResultStatus.SUCCESSFUL, 1, 1), name
        assert done.enqueued_at <= done.started_at <= done.finished_at
        assert done.task == runs[name][0]
    assert read("value").return_value == 42
    assert (read("async").args, read("async").kwargs) == ([1], {"two": 3})
    assert read("own_id").return_value == runs["own_id"][1].id
    assert read("context").return_value["attempt"] == 1
    expected = {
        "value_error": (ValueError, "ValueError: This task failed due to ValueError\n"),
        "system_exit": (SystemExit, "SystemExit: This task failed due to SystemExit\n"),
        "sys_exit": (SystemExit, "SystemExit: 1\n"),
        "not_json": (TypeError, None),
    }
    for name, (exception, ending) in expected.items():
        failed = read(name)
        assert (failed.status, [e.exception_class for e in failed.errors]) == (TaskResultStatus.FAILED, [exception])
        assert ending is None or failed.errors[0].traceback.endswith(ending), failed.errors[0].traceback
    assert "Unsupported type" in read("not_json").errors[0].traceback
    assert "WorkerLostError" not in worker.log_path.read_text()


def test_a_cold_shutdown_gives_the_task_back_without_an_error(cluster):
    """A worker's cold shutdown mid-task: the claim is given back, the task READY with no WorkerLost error."""
    import signal

    from scheduling.due_at import runner
    from scheduling.models import JobAttempt

    cold = {**WORKER_ENV, "REMAP_SIGTERM": "SIGQUIT", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS": "1"}
    worker = cluster.worker(env=cold)
    wait_ready(worker)
    result = tasks.holds.enqueue("cold", 60)
    wait_for(
        lambda: Execution.objects.filter(kind="holds").exists(), 60, message=f"the task to start ({worker.log_path})"
    )
    worker.signal(signal.SIGTERM)
    assert worker.popen.wait(30) is not None
    (attempt,) = JobAttempt.objects.filter(job__task_result_id=result.id)
    assert attempt.error == runner.RELEASE_REASON  # given back by the stopping process, not the sweeper
    after = tasks.holds.get_result(result.id)
    assert (after.status, after.errors, after.attempts) == (TaskResultStatus.READY, [], 1)


def test_an_async_task_that_times_out_is_cancelled(cluster):
    """An async task past its 1 s timeout is cancelled on its event loop: FAILED, and its later effect never happens."""
    worker = cluster.worker(env=WORKER_ENV)
    wait_ready(worker)
    result = tasks.async_sleepy.enqueue("async-timed-out", 3)
    job = wait_for(
        lambda: (j := ScheduledJob.objects.get(task_result_id=result.id)).state == JobState.DEAD and j,
        60,
        message=f"the worker to time the task out ({worker.log_path})",
    )
    assert "timed out after 1s" in job.last_error
    # A negative: the coroutine would have recorded its row 3 s after its start; wait past that, on the
    # database clock of the attempt, then look.
    time.sleep(4)
    assert not Execution.objects.filter(idempotency_key="async-timed-out").exists()


def test_a_running_task_aborted_through_the_tasks_door_is_interrupted_and_rolled_back(cluster):
    """backends.abort(result) on a real worker: the sleeping task interrupted, its atomic row gone, FAILED."""
    from scheduling import api, backends
    from scheduling.models import AttemptOutcome, JobAbort, JobAttempt

    worker = cluster.worker(env={**WORKER_ENV, "SCHEDULING_HEARTBEAT_SECONDS": "1"})
    wait_ready(worker)
    result = tasks.abortable.enqueue("aborted-task")
    wait_for(
        lambda: Execution.objects.filter(idempotency_key="aborted-task:started").exists(),
        60,
        message=f"the task to write its row and say so ({worker.log_path})",
    )
    assert tasks.abortable.get_result(result.id).status == TaskResultStatus.RUNNING
    job_id = backends.task_job(result).pk
    assert backends.abort(result, by="operator-11") == api.Aborted(job_id, "requested")
    wait_for(
        lambda: tasks.abortable.get_result(result.id).is_finished,
        tasks.ABORTABLE_HOLD_SECONDS / 2,
        interval=0.1,
        message=f"the abort to interrupt the task ({worker.log_path})",
    )
    aborted = tasks.abortable.get_result(result.id)
    assert (aborted.status, aborted.attempts) == (TaskResultStatus.FAILED, 1)
    assert [e.exception_class_path for e in aborted.errors] == ["scheduling.core.executor.JobAborted"]
    assert aborted.errors[0].traceback.startswith("aborted by operator-11 at ")
    assert ScheduledJob.objects.get(pk=job_id).state == JobState.CANCELLED
    (attempt,) = JobAttempt.objects.filter(job_id=job_id)
    assert attempt.outcome == AttemptOutcome.ABORTED
    assert aborted.finished_at == attempt.finished_at, "the abort ended the task with its attempt"
    # The task wrote its atomic row before the abort (it said so on another connection), and slept
    # on: the row is rolled back with the task, the sleep never ended ("woke" is never written).
    started = Execution.objects.get(idempotency_key="aborted-task:started")
    assert started.pid != os.getpid()  # a pool process ran it, not the test
    assert not Execution.objects.filter(idempotency_key="aborted-task").exists()
    assert not Execution.objects.filter(idempotency_key="aborted-task:woke").exists()
    took = (attempt.finished_at - JobAbort.objects.get(job_id=job_id).requested_at).total_seconds()
    print(f"task aborted through backends.abort: interrupted {took:.2f} s after the request (heartbeat 1 s)")
    assert (attempt.finished_at - attempt.started_at).total_seconds() < tasks.ABORTABLE_HOLD_SECONDS
    assert worker.alive(), "the pool process lives on"
