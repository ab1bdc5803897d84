"""Handler-chosen outcomes of fixed-time runs: Discard and Cancel end the run, RetryAfter is one of its
retries, Snooze calls again within the tick (bounded)."""

from __future__ import annotations

import pytest

from scheduling import registry, schedules
from scheduling.core import store
from scheduling.fixed import gate
from scheduling.models import RunState, SchedulePolicy, ScheduleRun

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[int] = []  # the attempt number of every call


@registry.handler("tests.fixed_choose", schema={"type": "object"}, timeout=30, max_snoozes=2)
def choose(job: registry.Job) -> None:
    """Raise what the payload says for the first ``times`` calls, then succeed."""
    CALLS.append(job.attempt)
    if len(CALLS) > job.payload.get("times", 99):
        return
    do = job.payload["do"]
    if do == "snooze":
        raise registry.Snooze(0.01)
    if do == "retry_after":
        raise registry.RetryAfter(0.01, "429")
    if do == "discard":
        raise registry.Discard("nothing to report")
    raise registry.Cancel("the report was withdrawn")


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


def _schedule(payload: dict, backoff_limit: int = 0) -> SchedulePolicy:
    declaration = schedules.make(
        name="choose", kind="tests.fixed_choose", every=60, payload=payload, backoff_limit=backoff_limit
    )
    schedules.sync(declarations=[declaration])
    return SchedulePolicy.objects.get(periodic_task__name="choose")


@pytest.mark.parametrize(
    ("do", "state", "error"),
    [
        ("discard", RunState.DISCARDED, "Discard: nothing to report"),
        ("cancel", RunState.CANCELLED, "Cancel: the report was withdrawn"),
    ],
)
def test_discard_and_cancel_end_the_run_with_that_outcome_and_no_retry(do, state, error):
    """With retries left, Discard / Cancel end the run at once: discarded / cancelled, the reason kept."""
    policy = _schedule({"do": do}, backoff_limit=3)
    tick = store.database_now()
    assert gate.run("choose", tick).outcome == state
    run = ScheduleRun.objects.get(schedule=policy, tick=tick)
    assert (run.state, run.error, run.attempt) == (state, error, 1)
    assert CALLS == [1]


def test_retry_after_is_one_of_the_schedules_retries():
    """backoff_limit=1: RetryAfter then success is attempt 2; RetryAfter twice fails the run."""
    _schedule({"do": "retry_after", "times": 1}, backoff_limit=1)
    assert gate.run("choose", store.database_now()).outcome == RunState.SUCCEEDED
    assert CALLS == [1, 2]
    CALLS.clear()
    _schedule({"do": "retry_after"}, backoff_limit=1)
    assert gate.run("choose", store.database_now()).outcome == RunState.FAILED
    assert CALLS == [1, 2]


def test_a_snooze_calls_again_within_the_tick_without_using_a_retry_up_to_max_snoozes():
    """backoff_limit=0, max_snoozes=2: two snoozes then success succeeds on attempt 1; a third snooze fails it."""
    _schedule({"do": "snooze", "times": 2})
    assert gate.run("choose", store.database_now()).outcome == RunState.SUCCEEDED
    assert CALLS == [1, 1, 1]
    CALLS.clear()
    _schedule({"do": "snooze"})
    assert gate.run("choose", store.database_now()).outcome == RunState.FAILED
    assert CALLS == [1, 1, 1]
