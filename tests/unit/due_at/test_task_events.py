"""A job's attempt as Celery task events: the fields Flower reads, and nothing of the payload or error message."""

from __future__ import annotations

import datetime as dt

import pytest

from scheduling.due_at import task_events
from scheduling.models import AttemptOutcome, JobState

T0 = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.UTC)


def _event(outcome: str, state_after: str, error: str = "") -> task_events.JobEvent:
    return task_events.JobEvent(
        job_id=42,
        kind="billing.invoice",
        attempt=2,
        due_at=T0,
        started_at=T0 + dt.timedelta(seconds=1),
        finished_at=T0 + dt.timedelta(seconds=1.25),
        outcome=outcome,
        state_after=state_after,
        error=error,
    )


@pytest.mark.parametrize(
    ("outcome", "state_after", "kind_of_event"),
    [
        (AttemptOutcome.SUCCEEDED, JobState.DONE, "task-succeeded"),
        (AttemptOutcome.FAILED, JobState.DEAD, "task-failed"),
        (AttemptOutcome.FAILED, JobState.PENDING, "task-retried"),
        (AttemptOutcome.TIMED_OUT, JobState.DEAD, "task-failed"),
    ],
)
def test_an_attempt_is_one_event_of_its_outcome_carrying_the_task(outcome, state_after, kind_of_event):
    """Succeeded, failed (dead) or retried (pending again), with the kind, job id, times and the batch."""
    event_type, values = task_events.fields(_event(outcome, state_after, "ValueError: card 4111 declined"), "batch-1")
    assert event_type == kind_of_event
    assert (values["uuid"], values["name"], values["args"], values["retries"], values["parent_id"]) == (
        "job-42-2-batch-1",  # searchable in Flower by "job-42"
        "billing.invoice",
        "[42]",
        1,
        "batch-1",
    )
    start = (T0 + dt.timedelta(seconds=1)).timestamp()
    assert (values["received"], values["started"], values["runtime"]) == (start, start, pytest.approx(0.25))
    assert values["timestamp"] == (T0 + dt.timedelta(seconds=1.25)).timestamp()
    assert "4111" not in str(values)  # the error's message may hold personal data: only its type leaves


def test_a_success_carries_no_result():
    """task-succeeded has no result (a return value may hold personal data) and no exception."""
    _, values = task_events.fields(_event(AttemptOutcome.SUCCEEDED, JobState.DONE), "b")
    assert "result" not in values
    assert "exception" not in values


@pytest.mark.parametrize(
    ("error", "shown"),
    [("ValueError: x", "ValueError"), ("tasks.demo.DemoFailure: boom", "tasks.demo.DemoFailure"), ("a b: c", "Error")],
)
def test_error_type_keeps_the_type_only(error, shown):
    """The exception's dotted type name is kept; anything else becomes "Error"."""
    assert task_events.error_type(error) == shown


def test_a_batch_is_one_success_carrying_what_celery_received_would():
    """The batch's own event: its id, shadow name and args (its claims), received and started as it started."""
    batch = task_events.Batch(id="b-1", name="batch:billing.invoice", args="[[[42, 'token']]]", retries=1)
    start = T0.timestamp()
    values = task_events.batch_fields(batch, start, start + 0.5)
    assert (values["uuid"], values["name"], values["args"], values["retries"]) == (
        "b-1",
        "batch:billing.invoice",
        "[[[42, 'token']]]",
        1,
    )
    assert (values["received"], values["started"], values["runtime"], values["timestamp"]) == (
        start,
        start,
        0.5,
        start + 0.5,
    )


class _Recorder:
    """Stands in for the worker's event dispatcher: records what would be published."""

    enabled = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object]]] = []

    def send(self, type: str, **fields: object) -> None:
        self.sent.append((type, fields))


def test_the_batch_request_announces_only_what_did_not_succeed():
    """Started and succeeded ride in the pool's message; a failure, a loss or a revoke is Celery's, sent as before."""
    request = object.__new__(task_events.BatchRequest)
    recorder = _Recorder()
    request._eventer = recorder
    request.id, request.name = "b-1", "batch:billing.invoice"  # as Request.__init__ sets them from the message
    request._argsrepr, request._kwargsrepr = "[[[42, 'token']]]", "{}"
    request._request_dict, request._root_id, request._parent_id = {"retries": 1}, "r-1", None
    for type_ in ("task-started", "task-succeeded", "task-failed", "task-revoked", "task-retried", "task-rejected"):
        request.send_event(type_, requeue=True)
    assert [sent[0] for sent in recorder.sent] == ["task-failed", "task-revoked", "task-retried", "task-rejected"]
    # no task-received went before them: each carries the batch's name and args itself
    assert recorder.sent[-1][1] == {
        "uuid": "b-1",
        "name": "batch:billing.invoice",
        "args": "[[[42, 'token']]]",
        "kwargs": "{}",
        "retries": 1,
        "root_id": "r-1",
        "parent_id": None,
        "requeue": True,
    }


def test_run_batch_sends_no_celery_events_of_its_own_and_its_requests_are_batch_requests():
    """The task as the worker sees it: send_events off, and the request class the strategy builds from is ours."""
    from kombu.utils.imports import symbol_by_name

    from scheduling import tasks

    assert tasks.run_batch.send_events is False
    assert symbol_by_name(tasks.run_batch.Request) is task_events.BatchRequest
