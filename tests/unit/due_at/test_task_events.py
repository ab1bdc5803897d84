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
    ("outcome", "state_after", "last"),
    [
        (AttemptOutcome.SUCCEEDED, JobState.DONE, "task-succeeded"),
        (AttemptOutcome.FAILED, JobState.DEAD, "task-failed"),
        (AttemptOutcome.FAILED, JobState.PENDING, "task-retried"),
        (AttemptOutcome.TIMED_OUT, JobState.DEAD, "task-failed"),
    ],
)
def test_an_attempt_is_received_started_then_its_outcome(outcome, state_after, last):
    """received (at the start), then succeeded, failed (dead) or retried (pending again), under one task id."""
    events = task_events.fields(_event(outcome, state_after, "ValueError: card 4111 declined"), "batch-1")
    assert [t for t, _ in events] == ["task-received", last]
    assert {f["uuid"] for _, f in events} == {"job-42-2-batch-1"}  # searchable in Flower by "job-42"
    received = events[0][1]
    assert (received["name"], received["args"], received["retries"], received["parent_id"]) == (
        "billing.invoice",
        "[42]",
        1,
        "batch-1",
    )
    assert events[0][1]["timestamp"] == (T0 + dt.timedelta(seconds=1)).timestamp()
    assert "4111" not in str(events)  # the error's message may hold personal data: only its type leaves


def test_a_success_carries_its_runtime_and_no_result():
    """task-succeeded has the attempt's runtime and no result (a return value may hold personal data)."""
    (_, (_, succeeded)) = task_events.fields(_event(AttemptOutcome.SUCCEEDED, JobState.DONE), "b")
    assert succeeded["runtime"] == pytest.approx(0.25)
    assert "result" not in succeeded


@pytest.mark.parametrize(
    ("error", "shown"),
    [("ValueError: x", "ValueError"), ("tasks.demo.DemoFailure: boom", "tasks.demo.DemoFailure"), ("a b: c", "Error")],
)
def test_error_type_keeps_the_type_only(error, shown):
    """The exception's dotted type name is kept; anything else becomes "Error"."""
    assert task_events.error_type(error) == shown
