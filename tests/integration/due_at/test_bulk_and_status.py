"""schedule_many (bulk insert), capped status counts and the claim path's asynchronous commits."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from scheduling import api, exceptions
from scheduling.due_at import store
from scheduling.models import JobState, ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = {"user_id": 1, "trial_id": 2}


def test_schedule_many_stores_every_payload_at_one_due_time():
    """Each payload becomes a pending row of the kind, in order, all due at the same database time."""
    ids = api.schedule_many("reminders.trial_ending", [{"user_id": i, "trial_id": i} for i in range(1, 6)], delay=60)
    jobs = list(ScheduledJob.objects.filter(pk__in=ids).order_by("id"))
    assert [job.payload["user_id"] for job in jobs] == [1, 2, 3, 4, 5]
    assert {job.state for job in jobs} == {JobState.PENDING}
    assert len({job.due_at for job in jobs}) == 1
    assert {job.max_attempts for job in jobs} == {5}


def test_schedule_many_refuses_a_bad_payload_and_stores_nothing():
    """One payload failing the schema is a named error and no row of the call is stored."""
    with pytest.raises(exceptions.InvalidPayload):
        api.schedule_many("reminders.trial_ending", [PAYLOAD, {"user_id": "x", "trial_id": 2}], delay=5)
    with pytest.raises(exceptions.InvalidSchedule):
        api.schedule_many("reminders.trial_ending", [PAYLOAD], delay=5, due_at=None, max_attempts=0)
    assert not ScheduledJob.objects.exists()


def test_schedule_many_joins_the_callers_transaction():
    """A rolled-back bulk insert leaves nothing."""

    def enqueue_then_fail() -> None:
        with transaction.atomic():
            api.schedule_many("demo.noop", [{}, {}, {}], delay=0)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not ScheduledJob.objects.exists()
    assert api.schedule_many("demo.noop", [], delay=0) == []


def test_status_counts_are_exact_up_to_the_limit_then_estimated(run_sql):
    """Under the limit the counts are exact; past it they are planner estimates and named as such."""
    api.schedule_many("demo.noop", [{}] * 3, delay=0)
    exact = store.backlog_status(300, exact_limit=10)
    assert exact.backlog == 3
    assert exact.pending == 3
    assert exact.estimated == ()
    api.schedule_many("demo.noop", [{}] * 40, delay=0)
    run_sql("ANALYZE scheduling_scheduledjob")
    capped = store.backlog_status(300, exact_limit=10)
    assert set(capped.estimated) == {"backlog", "pending"}
    assert capped.backlog > 10
    assert capped.pending > 10
    assert capped.due_next_24h == 0


def test_claim_path_statements_commit_on_their_own_and_join_a_callers_transaction():
    """Outside a transaction a claim commits by itself; inside one it is undone with the caller's rollback."""
    api.schedule_many("demo.noop", [{}, {}], delay=0)
    claimed: list[store.Claim] = []

    def claim_then_fail() -> None:
        with transaction.atomic():
            claimed.extend(store.claim_due_jobs(1))
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        claim_then_fail()
    assert len(claimed) == 1
    assert ScheduledJob.objects.filter(state=JobState.CLAIMED).count() == 0
    assert len(store.claim_due_jobs(1)) == 1
    assert connection.get_autocommit()
    assert ScheduledJob.objects.filter(state=JobState.CLAIMED).count() == 1
