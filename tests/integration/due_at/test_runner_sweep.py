"""Running claimed jobs and sweeping dead claims, against real PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from scheduling import api
from scheduling.core import store as core_store
from scheduling.due_at import claim, runner, sweep
from scheduling.due_at import store as jobs_store
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_one(run_sql, kind: str = "demo.record", payload: dict | None = None) -> jobs_store.Claim:
    job = api.schedule(kind, payload or {}, delay=60)
    support.make_due(job.id)
    (claim,) = jobs_store.claim_due_jobs(10)
    return claim


def test_run_batch_completes_and_records_the_attempt(run_sql):
    """A claimed job runs, ends done, and gets one succeeded attempt with its due time."""
    claim = _claim_one(run_sql)
    report = runner.run_batch([(claim.id, claim.token)])
    assert (report.started, report.succeeded, report.failed) == (1, 1, 0)
    job = ScheduledJob.objects.get(pk=claim.id)
    assert job.state == JobState.DONE
    assert job.finished_at is not None
    attempt = JobAttempt.objects.get(job_id=claim.id)
    assert attempt.outcome == AttemptOutcome.SUCCEEDED
    assert attempt.due_at == job.due_at
    assert attempt.started_at <= attempt.finished_at


def test_a_claim_runs_at_most_once(run_sql):
    """A second delivery of the same batch (same token) runs nothing: the claim was already started."""
    claim = _claim_one(run_sql, payload={"label": "once"})
    run_sql("UPDATE scheduling_scheduledjob SET state = 'running', claimed_by = 'crashed:1' WHERE id = %s", [claim.id])
    report = runner.run_batch([(claim.id, claim.token)])
    assert (report.started, report.skipped) == (0, 1)
    assert Execution.objects.count() == 0


def test_stale_completion_is_rejected(run_sql):
    """An outcome presented with an old token changes nothing and records no attempt."""
    claim = _claim_one(run_sql)
    started = jobs_store.start_jobs([(claim.id, claim.token)], "w:1")
    assert len(started) == 1
    # The sweeper takes it back and someone else claims it: a new token.
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", [claim.id])
    assert sweep.reclaim_expired() == (1, 0)
    support.make_due(claim.id)
    (again,) = jobs_store.claim_due_jobs(1)
    assert again.token != claim.token
    now = started[0].db_now
    stale = jobs_store.Outcome(claim.id, claim.token, now, now, AttemptOutcome.SUCCEEDED)
    assert jobs_store.complete_jobs([stale]) == []
    assert jobs_store.fail_jobs([stale]) == []
    job = ScheduledJob.objects.get(pk=claim.id)
    assert job.state == JobState.CLAIMED
    assert str(job.token) == again.token
    outcomes = list(JobAttempt.objects.filter(job_id=claim.id).values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.RECLAIMED]


def test_failure_moves_due_at_by_backoff(run_sql):
    """A failed attempt returns the job to pending, due later by the kind's backoff (1-2 s for demo.fail)."""
    claim = _claim_one(run_sql, kind="demo.fail")
    (db_before,) = run_sql("SELECT now()")[0]
    report = runner.run_batch([(claim.id, claim.token)])
    assert report.failed == 1
    job = ScheduledJob.objects.get(pk=claim.id)
    assert job.state == JobState.PENDING
    assert job.token is None
    assert "failed on purpose" in job.last_error
    delay = (job.due_at - db_before).total_seconds()
    assert 0.5 <= delay <= 3.0
    assert JobAttempt.objects.get(job_id=claim.id).outcome == AttemptOutcome.FAILED


def test_failure_at_max_attempts_is_dead(run_sql):
    """The attempt that spends max_attempts leaves the job dead, not pending."""
    job = api.schedule("demo.fail", {}, delay=60, max_attempts=1)
    support.make_due(job.id)
    (claim,) = jobs_store.claim_due_jobs(1)
    runner.run_batch([(claim.id, claim.token)])
    stored = ScheduledJob.objects.get(pk=job.id)
    assert stored.state == JobState.DEAD
    assert stored.finished_at is not None


def test_sweeper_reclaims_after_the_lease_only(run_sql):
    """A claim with a fresh heartbeat is kept; one older than its lease goes back to pending."""
    claim = _claim_one(run_sql)
    jobs_store.start_jobs([(claim.id, claim.token)], "w:1")
    assert sweep.reclaim_expired() == (0, 0)
    assert ScheduledJob.objects.get(pk=claim.id).state == JobState.RUNNING
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '61 seconds' WHERE id = %s", [claim.id])
    assert sweep.reclaim_expired() == (1, 0)
    job = ScheduledJob.objects.get(pk=claim.id)
    assert job.state == JobState.PENDING
    assert job.attempts == 1
    attempt = JobAttempt.objects.get(job_id=claim.id)
    assert attempt.outcome == AttemptOutcome.RECLAIMED
    assert attempt.worker == "w:1"


def test_sweeper_kills_after_max_attempts(run_sql):
    """A stranded claim whose attempts are spent becomes dead instead of pending."""
    job = api.schedule("demo.record", {}, delay=60, max_attempts=1)
    support.make_due(job.id)
    jobs_store.claim_due_jobs(1)
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '2 minutes' WHERE id = %s", [job.id])
    assert sweep.reclaim_expired() == (0, 0), "never started: its message must be missing at two sweeps"
    assert sweep.reclaim_expired() == (0, 1)
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD


@override_settings(SCHEDULING_HEARTBEAT_SECONDS=0, SCHEDULING_SWEEP_AFTER_SECONDS=900)
def test_without_heartbeats_the_claimed_at_rule_applies(run_sql):
    """With heartbeats off, a claim is stranded only after SWEEP_AFTER_SECONDS since claimed_at."""
    claim = _claim_one(run_sql)
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", [claim.id])
    assert sweep.reclaim_expired() == (0, 0)
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '16 minutes' WHERE id = %s", [claim.id])
    assert sweep.reclaim_expired() == (0, 0), "never started: its message must be missing at two sweeps"
    assert sweep.reclaim_expired() == (1, 0)


def test_prune_deletes_old_finished_jobs_with_attempts(run_sql):
    """Finished jobs past the retention go, with their attempts; recent and live ones stay."""
    old = _claim_one(run_sql)
    runner.run_batch([(old.id, old.token)])
    recent = _claim_one(run_sql)
    runner.run_batch([(recent.id, recent.token)])
    live = api.schedule("demo.record", {}, delay=3600)
    run_sql("UPDATE scheduling_scheduledjob SET finished_at = now() - interval '15 days' WHERE id = %s", [old.id])
    assert sweep.prune() == 1
    assert set(ScheduledJob.objects.values_list("id", flat=True)) == {recent.id, live.id}
    assert not JobAttempt.objects.filter(job_id=old.id).exists()


def test_status_counts_backlog_and_stuck(run_sql):
    """status() reports overdue pending rows, the oldest overdue age and stuck claims."""
    stuck = _claim_one(run_sql)
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '5 minutes' WHERE id = %s", [stuck.id])
    for _ in range(3):
        job = api.schedule("demo.noop", {}, delay=60)
        support.make_due(job.id, ago="30 seconds")
    api.schedule("demo.noop", {}, delay=3600)
    status = api.status()
    assert status["backlog"] == 3
    assert 29 <= status["oldest_overdue_seconds"] <= 40
    assert status["pending"] == 4
    assert status["claimed"] == 1
    assert status["stuck"] == 1
    assert status["due_next_24h"] == 1


def test_released_claims_go_back_to_pending(run_sql):
    """A worker shutting down can give back its claims: pending again, attempt recorded as reclaimed."""
    claim = _claim_one(run_sql)
    assert jobs_store.release_jobs([(claim.id, claim.token)], "worker shutting down") == [
        jobs_store.MovedJob(claim.id, JobState.PENDING)
    ]
    job = ScheduledJob.objects.get(pk=claim.id)
    assert job.state == JobState.PENDING
    assert JobAttempt.objects.get(job_id=claim.id).error == "worker shutting down"
    assert job.due_at <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=61)


def test_a_stopping_batch_charges_only_the_job_that_was_running(run_sql):
    """give_back_stopping: the running job is charged (dead: its last attempt); the unstarted ones go back uncounted."""
    ids = api.schedule_many("demo.record", [{}] * 3, delay=60, max_attempts=1)
    support.make_due(ids)
    claims = jobs_store.claim_due_jobs(3)
    jobs_store.start_jobs([(c.id, c.token) for c in claims], "host:4242")
    running, *waiting = claims
    moved = jobs_store.give_back_stopping([(c.id, c.token) for c in claims], running.id, runner.RELEASE_REASON)
    states = {m.id: m.state for m in moved}
    assert states == {running.id: JobState.DEAD, **{c.id: JobState.PENDING for c in waiting}}
    assert list(JobAttempt.objects.filter(job_id=running.id).values_list("outcome", "error")) == [
        (AttemptOutcome.RECLAIMED, runner.RELEASE_REASON)
    ]
    for job in ScheduledJob.objects.filter(id__in=[c.id for c in waiting]):
        assert (job.state, job.attempts, job.max_attempts, job.claimed_by) == (JobState.PENDING, 0, 1, "")
    assert not JobAttempt.objects.filter(job_id__in=[c.id for c in waiting]).exists(), "they ran nothing"


# --- Crash isolation: a batch that died with its process -------------------------------------------


def _crashed_batch(run_sql, n: int, *, max_attempts: int = 3, worker: str = "host:4242") -> list[jobs_store.Claim]:
    """Claim ``n`` demo.record jobs as one batch, start it on ``worker``, then let its heartbeat go stale."""
    ids = api.schedule_many("demo.record", [{}] * n, delay=60, max_attempts=max_attempts)
    support.make_due(ids)
    claims = jobs_store.claim_due_jobs(n)
    assert sorted(c.id for c in claims) == sorted(ids)
    assert len(jobs_store.start_jobs([(c.id, c.token) for c in claims], worker)) == n
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '61 seconds' WHERE id = ANY(%s)", [ids])
    return claims


def test_a_batch_that_died_together_is_charged_nothing_and_runs_alone_later(run_sql):
    """10 jobs of a dead batch: each pending, its attempt recorded but not counted, flagged run_alone, due later."""
    claims = _crashed_batch(run_sql, 10)
    (db_before,) = run_sql("SELECT now()")[0]
    assert sweep.reclaim_expired() == (10, 0)
    for job in ScheduledJob.objects.filter(pk__in=[c.id for c in claims]):
        assert (job.state, job.attempts, job.max_attempts, job.run_alone) == (JobState.PENDING, 1, 4, True)
        assert (job.due_at - db_before).total_seconds() >= 0.5, "the kind's backoff (1-5 s), not due at once"
        (attempt,) = JobAttempt.objects.filter(job_id=job.id)
        assert attempt.outcome == AttemptOutcome.RECLAIMED
        assert "a batch of 10 jobs; not counted" in attempt.error
    support.make_due(state="pending")
    again = jobs_store.claim_due_jobs(50, messages=50, batch_sizes={"demo.record": 50})
    assert len(again) == 10
    assert all(c.run_alone for c in again)
    assert [len(b) for b in claim.batches_for(again)] == [1] * 10, "each sent in a batch of its own"


def test_a_job_that_crashes_alone_is_charged_until_dead(run_sql):
    """A run_alone job whose process dies is charged each time (max_attempts unchanged) and ends dead."""
    (first,) = _crashed_batch(run_sql, 1, max_attempts=2)
    assert sweep.reclaim_expired() == (1, 0), "the only job of its batch: charged"
    job = ScheduledJob.objects.get(pk=first.id)
    assert (job.attempts, job.max_attempts, job.run_alone) == (1, 2, True)
    support.make_due(first.id)
    (second,) = jobs_store.claim_due_jobs(1)
    jobs_store.start_jobs([(second.id, second.token)], "host:4343")
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '61 seconds' WHERE id = %s", [first.id])
    assert sweep.reclaim_expired() == (0, 1)
    job = ScheduledJob.objects.get(pk=first.id)
    assert (job.state, job.attempts, job.max_attempts) == (JobState.DEAD, 2, 2)
    assert list(JobAttempt.objects.filter(job_id=first.id).values_list("number", flat=True)) == [1, 2]


def test_the_last_unfinished_job_of_a_batch_is_charged_and_the_finished_ones_untouched(run_sql):
    """Of a batch of 3, two finished before the process died: the third is the suspect, charged and flagged."""
    claims = _crashed_batch(run_sql, 3)
    now = core_store.database_now()
    assert jobs_store.complete_jobs(
        [jobs_store.Outcome(c.id, c.token, now, now, AttemptOutcome.SUCCEEDED) for c in claims[:2]]
    )
    assert sweep.reclaim_expired() == (1, 0)
    suspect = ScheduledJob.objects.get(pk=claims[2].id)
    assert (suspect.state, suspect.attempts, suspect.max_attempts, suspect.run_alone) == (JobState.PENDING, 1, 3, True)
    assert ScheduledJob.objects.filter(pk__in=[c.id for c in claims[:2]], state=JobState.DONE).count() == 2


def test_a_claim_whose_message_was_lost_keeps_its_due_time_and_is_not_flagged(run_sql):
    """Never started (its message lost): pending again at its due time, charged as before, not run_alone."""
    job = api.schedule("demo.record", {}, delay=60)
    support.make_due(job.id)
    assert len(jobs_store.claim_due_jobs(1)) == 1
    due_at = ScheduledJob.objects.get(pk=job.id).due_at
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '2 minutes' WHERE id = %s", [job.id])
    assert sweep.reclaim_expired() == (0, 0), "never started: its message must be missing at two sweeps"
    assert sweep.reclaim_expired() == (1, 0)
    stored = ScheduledJob.objects.get(pk=job.id)
    assert (stored.state, stored.attempts, stored.max_attempts, stored.run_alone) == (JobState.PENDING, 1, 3, False)
    assert stored.due_at == due_at
    assert "never started" in JobAttempt.objects.get(job_id=job.id).error


def test_a_batch_cut_by_a_sweep_statements_limit_stays_uncharged(run_sql, monkeypatch):
    """A dead batch of 4 swept 3 rows per statement: the last row, alone in the second statement, is not charged."""
    claims = _crashed_batch(run_sql, 4)
    monkeypatch.setattr(sweep, "RECLAIM_BATCH_SIZE", 3)
    assert sweep.reclaim_expired() == (4, 0)
    jobs = ScheduledJob.objects.filter(pk__in=[c.id for c in claims])
    assert {(j.attempts, j.max_attempts, j.run_alone) for j in jobs} == {(1, 4, True)}, "all four refunded"
    counted = JobAttempt.objects.filter(job_id__in=[c.id for c in claims]).exclude(error__contains="not counted")
    assert not counted.exists()
