"""Handler-chosen outcomes of broker deferrals: Snooze and RetryAfter as countdowns (a row past the ceiling),
Discard recorded dead at once, Cancel stops."""

from __future__ import annotations

import pytest
from celery.exceptions import Retry

from scheduling import registry
from scheduling import tasks as celery_tasks
from scheduling.deferrals import countdowns
from scheduling.models import JobState, ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)


def _choose(job: registry.Job) -> None:
    do = job.payload["do"]
    if do == "snooze":
        raise registry.Snooze(job.payload.get("seconds", 30))
    if do == "retry_after":
        raise registry.RetryAfter(job.payload.get("seconds", 40), "429")
    if do == "discard":
        raise registry.Discard("closed")
    raise registry.Cancel("withdrawn")


registry.handler("defer.choose", schema={"type": "object"}, max_attempts=3, max_snoozes=1)(_choose)


def test_a_snooze_is_a_countdown_of_the_same_attempt():
    """Snooze(30): the message comes back in 30 s with the same attempt number, signed again."""
    args = countdowns.message_args("defer.choose", {"do": "snooze"}, 2, "d-snooze")
    with pytest.raises(Retry) as raised:
        celery_tasks.run_deferred.apply(args=args, throw=True)
    retried = list(raised.value.sig.args)
    assert retried[:4] == ["defer.choose", {"do": "snooze"}, 2, "d-snooze"]
    assert countdowns.authentic(*retried)
    assert raised.value.when == 30


def test_a_snooze_past_max_snoozes_is_a_failure():
    """The kind's max_snoozes (1) already taken: the next snooze is a failure, retried with the backoff."""
    once = countdowns.run("defer.choose", {"do": "snooze"}, 1, "d-s2", None, snoozes=0)
    again = countdowns.run("defer.choose", {"do": "snooze"}, 1, "d-s2", None, snoozes=1)
    assert (once.outcome, once.retry_in_seconds) == ("snooze", 30)
    assert again.outcome == "retry"


def test_retry_after_is_the_next_attempt_after_its_delay_then_dead_when_spent():
    """RetryAfter(40): a retry of the next attempt in 40 s, not the backoff; on the last attempt a dead row."""
    result = countdowns.run("defer.choose", {"do": "retry_after"}, 1, "d-r", None)
    assert (result.outcome, result.retry_in_seconds) == ("retry", 40)
    last = countdowns.run("defer.choose", {"do": "retry_after"}, 3, "d-r", None)
    assert last.outcome == "dead"
    assert ScheduledJob.objects.get(pk=last.dead_job_id).last_error == "RetryAfter: 429"


def test_a_snooze_longer_than_the_ceiling_continues_as_a_row():
    """Snooze(2000 s), past the 900 s ceiling: no countdown; a pending row due then carries the work."""
    args = countdowns.message_args("defer.choose", {"do": "snooze", "seconds": 2000}, 1, "d-long")
    result = celery_tasks.run_deferred.apply(args=args, throw=True).get()
    job = ScheduledJob.objects.get(pk=result["job_id"])
    assert (job.kind, job.state, job.payload) == ("defer.choose", JobState.PENDING, {"do": "snooze", "seconds": 2000})


def test_discard_records_the_dead_row_at_once_with_its_reason():
    """Discard on attempt 1 of 3: dead at once, the reason on the row."""
    result = countdowns.run("defer.choose", {"do": "discard"}, 1, "d-d", None)
    assert result.outcome == "dead"
    job = ScheduledJob.objects.get(pk=result.dead_job_id)
    assert (job.state, job.last_error) == (JobState.DEAD, "Discard: closed")


def test_cancel_stops_and_stores_nothing():
    """Cancel: no retry, no row."""
    result = celery_tasks.run_deferred.apply(args=countdowns.message_args("defer.choose", {"do": "cancel"}, 1, "d-c"))
    assert result.get()["outcome"] == "cancelled"
    assert not ScheduledJob.objects.exists()
