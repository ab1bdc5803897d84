"""What a batch publishes for Flower, read off real Redis: its jobs' events and its own, in one message.

``collecting`` wraps ``runner.run_batch`` in the worker's ``scheduling.run_batch`` task. Celery's
own events of a batch are not sent (``send_events = False``), so the pool process's one
``task.multi`` message carries the batch's ``task-received`` and ``task-succeeded`` beside its
jobs' events; a batch that raised leaves its failure to Celery (``BatchRequest``).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from scheduling import api
from scheduling.core import broker
from scheduling.due_at import runner, store, task_events
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def published() -> Iterator[Any]:
    """A subscription to every fanout channel of the broker's Redis: Celery's events travel there."""
    pubsub = broker.client().pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe("*celeryev*")
    pubsub.get_message(timeout=1.0)  # the subscription's confirmation
    yield pubsub
    pubsub.close()


def events_of(pubsub: Any, batch_id: str, seconds: float = 2.0) -> list[dict[str, Any]]:
    """The events published within ``seconds`` that belong to ``batch_id`` (the batch's, or its jobs')."""
    found: list[dict[str, Any]] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        message = pubsub.get_message(timeout=0.1)
        if message is None:
            continue
        envelope = json.loads(message["data"])
        body = envelope["body"]
        if envelope["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        payload = json.loads(body)
        for event in payload if isinstance(payload, list) else [payload]:
            if event.get("uuid") == batch_id or event.get("parent_id") == batch_id:
                found.append(event)
        if found:
            stop = min(stop, time.monotonic() + 0.3)  # the rest of one message arrives with it
    return found


def _batch() -> task_events.Batch:
    batch_id = str(uuid.uuid4())
    return task_events.Batch(id=batch_id, name="batch:demo.record", args="[[[1, 'token']]]")


def _run_one(label: str) -> int:
    job = api.schedule("demo.record", {"label": label}, delay=60)
    support.make_due(job.id)
    (claim,) = store.claim_due_jobs(10)
    runner.run_batch([(claim.id, claim.token)])
    return job.id


def test_a_batch_that_succeeded_publishes_its_jobs_and_itself_in_one_message(published):
    """The job's outcome, then the batch's received, started (Flower's prefetch gauge takes it off) and succeeded."""
    batch = _batch()
    with task_events.collecting(batch=batch, hostname="w1@test"):
        job_id = _run_one("events")
    events = events_of(published, batch.id)
    assert [(e["type"], e["uuid"]) for e in events] == [
        ("task-succeeded", f"job-{job_id}-1-{batch.id[:8]}"),
        ("task-received", batch.id),
        ("task-started", batch.id),
        ("task-succeeded", batch.id),
    ]
    received, started, succeeded = events[1], events[2], events[3]
    assert (received["name"], received["args"], received["hostname"]) == ("batch:demo.record", batch.args, "w1@test")
    assert succeeded["runtime"] >= 0
    assert succeeded["received"] == succeeded["started"] == received["timestamp"] == started["timestamp"]


def test_a_batch_that_raised_publishes_its_jobs_but_not_a_success(published):
    """The jobs that ran are reported; the batch's failure is Celery's to announce, not a success here."""
    batch = _batch()
    ran: list[int] = []

    def fail_after_the_jobs() -> None:
        with task_events.collecting(batch=batch, hostname="w1@test"):
            ran.append(_run_one("raised"))
            raise RuntimeError("the batch failed after its jobs")

    with pytest.raises(RuntimeError):
        fail_after_the_jobs()
    (job_id,) = ran
    events = events_of(published, batch.id)
    assert [(e["type"], e["uuid"]) for e in events] == [("task-succeeded", f"job-{job_id}-1-{batch.id[:8]}")]


@override_settings(SCHEDULING_JOB_TASK_EVENTS=False)
def test_with_job_events_off_the_batch_still_reports_itself(published):
    """SCHEDULING_JOB_TASK_EVENTS = False: no job events, and the batch still shows (Celery sends none for it)."""
    batch = _batch()
    with task_events.collecting(batch=batch, hostname="w1@test"):
        _run_one("jobs-off")
    assert [(e["type"], e["uuid"]) for e in events_of(published, batch.id)] == [
        ("task-received", batch.id),
        ("task-started", batch.id),
        ("task-succeeded", batch.id),
    ]


def test_a_chunk_lost_at_its_commit_shows_flower_no_outcome_of_it(raw_connect, monkeypatch):
    """The chunk's outcomes are written, then its session ends before the COMMIT (a server restart, an idle
    limit): the job is pending again, so its task-succeeded, collected with the outcomes, is dropped.
    The fault is real: another connection terminates the chunk's backend at that point."""
    from django.db import connection

    from scheduling.models import JobState, ScheduledJob

    job = api.schedule("demo.noop", {}, delay=60)
    support.make_due(job.id)
    (claim,) = store.claim_due_jobs(10)
    killer = raw_connect(autocommit=True)
    write_outcomes = runner._record

    def write_then_lose_the_session(*args: Any, **kwargs: Any) -> None:
        write_outcomes(*args, **kwargs)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        with killer.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    monkeypatch.setattr(runner, "_record", write_then_lose_the_session)
    collector = task_events.Collector()
    token = task_events._collector.set(collector)
    try:
        runner.run_batch([(claim.id, claim.token)])
    finally:
        task_events._collector.reset(token)
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING
    assert [e for e in collector.events if e.job_id == job.id and e.outcome == "succeeded"] == []
