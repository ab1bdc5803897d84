"""Django's Tasks API end to end: a view enqueues, a real ``celery worker`` runs, the result is read back."""

from __future__ import annotations

import os

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
