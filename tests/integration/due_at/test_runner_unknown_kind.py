"""A job of a kind this process does not know (a rolling deploy's old release): given back uncharged, sent unlimited.

Each test claims with ``store.claim_due_jobs`` and runs ``runner.run_batch`` in this process; the kind
is made unknown by renaming the row's kind after it was scheduled.
"""

from __future__ import annotations

import pytest

from scheduling import api
from scheduling.due_at import claim, runner, store
from scheduling.models import JobAttempt, JobState, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


def _unknown_job(run_sql) -> int:
    job = api.schedule("demo.noop", {}, delay=60, max_attempts=1)
    run_sql("UPDATE scheduling_scheduledjob SET kind = 'new.release' WHERE id = %s", [job.id])
    support.make_due()
    return job.id


def test_a_worker_gives_back_a_job_of_a_kind_it_does_not_know_uncharged(run_sql):
    """Started by a worker that does not know its kind: pending again later, no attempt charged or recorded."""
    job_id = _unknown_job(run_sql)
    claims = store.claim_due_jobs(10)
    report = runner.run_batch([(c.id, c.token) for c in claims])
    assert (report.started, report.given_back, report.failed) == (0, 1, 0)
    row = ScheduledJob.objects.get(pk=job_id)
    assert (row.state, row.attempts, row.token, row.claimed_by) == (JobState.PENDING, 0, None, "")
    assert "does not know kind new.release" in row.last_error
    assert not JobAttempt.objects.filter(job_id=job_id).exists()
    (late,) = run_sql("SELECT due_at - now() FROM scheduling_scheduledjob WHERE id = %s", [job_id])[0]
    assert late.total_seconds() > runner.UNKNOWN_KIND_RETRY_SECONDS / 2, "not due again at once (no hot loop)"


def test_a_batch_of_a_kind_the_sender_does_not_know_carries_no_hard_limit(run_sql):
    """The claim sends a kind it does not know with no Celery time limit: a guessed one could kill the job."""
    _unknown_job(run_sql)
    (batch,) = claim.batches_for(store.claim_due_jobs(10))
    assert claim.hard_time_limit(batch) is None
