"""A job's own timeout, backoff and atomicity (``schedule(timeout=, backoff=, atomic=)``) through the real runner.

Each test claims with ``store.claim_due_jobs`` and runs ``runner.run_batch`` in this process.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from scheduling import api, backends, exceptions, registry
from scheduling.core import exceptions as core_exceptions
from scheduling.core import validation
from scheduling.due_at import claim, runner, store, sweep
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests import support
from tests.taskkit import tasks

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[str] = []  # idle_in_transaction_session_timeout as the handler saw it


def _work(job: registry.Job) -> None:
    """Write one row, note the transaction's idle limit, then sleep or fail as the payload says."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        SEEN.append(cursor.fetchone()[0])
    time.sleep(float(job.payload.get("sleep", 0)))
    if job.payload.get("fail"):
        raise RuntimeError("failing after a write, on purpose")


registry.handler("opt.atomic", schema={"type": "object"}, timeout=1, max_attempts=3)(_work)
registry.handler("opt.committing", schema={"type": "object"}, timeout=1, max_attempts=3, atomic=False)(_work)


def _run(run_sql) -> runner.BatchReport:
    support.make_due(state="pending")
    claims = store.claim_due_jobs(100)
    return runner.run_batch([(c.id, c.token) for c in claims])


def _attempt(job_id: int) -> JobAttempt:
    return JobAttempt.objects.get(job_id=job_id)


def test_a_shorter_own_timeout_stops_the_handler_at_the_calls_limit(run_sql):
    """Kind timeout 1 s, job timeout 0.2 s, handler sleeps 0.6 s: timed out, the error names 0.2 s."""
    job = api.schedule("opt.committing", {"sleep": 0.6}, delay=0, timeout=0.2)
    _run(run_sql)
    attempt = _attempt(job.id)
    assert attempt.outcome == AttemptOutcome.TIMED_OUT
    assert "0.2s" in attempt.error


def test_a_longer_own_timeout_lets_the_handler_finish_past_the_kinds(run_sql):
    """Kind timeout 1 s, job timeout 5 s, handler sleeps 1.5 s: it succeeds (the kind's would have stopped it)."""
    job = api.schedule("opt.committing", {"sleep": 1.5}, delay=0, timeout=5)
    other = api.schedule("opt.committing", {"sleep": 1.5}, delay=0)
    _run(run_sql)
    assert _attempt(job.id).outcome == AttemptOutcome.SUCCEEDED
    assert _attempt(other.id).outcome == AttemptOutcome.TIMED_OUT


def test_an_atomic_chunk_is_bounded_by_its_jobs_own_timeout(run_sql):
    """The chunk's idle limit is the job's own timeout (50 s) plus the stall margin, not the kind's 1 s."""
    SEEN.clear()
    api.schedule("opt.atomic", {}, delay=0, timeout=50)
    _run(run_sql)
    assert f"{int(50 + runner.STALL_MARGIN_SECONDS)}s" == SEEN[0]
    assert len(SEEN) == 1


def test_an_own_backoff_sets_the_retrys_due_time(run_sql):
    """A failure is due again after the job's backoff (1000 s: 500-1000 s), not the kind's (10 s: 5-10 s)."""
    job = api.schedule("opt.committing", {"fail": True}, delay=0, backoff=registry.Backoff(1000, 1000))
    plain = api.schedule("opt.committing", {"fail": True}, delay=0)
    _run(run_sql)
    (own, kinds) = run_sql(
        "SELECT extract(epoch FROM due_at - now()) FROM scheduling_scheduledjob WHERE id IN (%s, %s) ORDER BY id",
        [job.id, plain.id],
    )
    assert 490 <= own[0] <= 1000
    assert kinds[0] <= 10


def test_the_sweepers_retry_uses_the_jobs_own_backoff(run_sql):
    """A started claim taken back from a dead worker is due again after the job's own backoff."""
    job = api.schedule("opt.committing", {}, delay=60, backoff=registry.Backoff(1000, 1000))
    support.make_due(job.id, ago="0 s")
    (c,) = store.claim_due_jobs(10)
    store.start_jobs([(c.id, c.token)], "w:1")
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", [job.id])
    assert sweep.reclaim_expired() == (1, 0)
    ((left,),) = run_sql(
        "SELECT extract(epoch FROM due_at - now()) FROM scheduling_scheduledjob WHERE id = %s", [job.id]
    )
    assert 490 <= left <= 1000


def test_atomic_false_commits_as_it_goes_and_atomic_true_rolls_back_with_its_failure(run_sql):
    """Own atomic=False on an atomic kind keeps its failed write; own atomic=True on a committing kind loses it."""
    committing = api.schedule("opt.atomic", {"fail": True}, delay=0, atomic=False)
    atomic = api.schedule("opt.committing", {"fail": True}, delay=0, atomic=True)
    report = _run(run_sql)
    assert report.failed == 2
    assert report.chunks == 1  # the atomic=True job ran in the atomic path, the other did not
    assert Execution.objects.filter(idempotency_key=f"job:{committing.id}").count() == 1
    assert Execution.objects.filter(idempotency_key=f"job:{atomic.id}").count() == 0


def test_the_claims_hard_limit_sums_each_jobs_own_timeout(run_sql):
    """Celery's limit for a batch counts a job's own timeout (100 s) and the kind's (1 s) for the others."""
    api.schedule("opt.atomic", {}, delay=60, timeout=100)
    api.schedule_many("opt.atomic", [{}, {}], delay=60)
    support.make_due()
    claims = store.claim_due_jobs(10, batch_sizes={"opt.atomic": 10})
    (batch,) = claim.batches_for(claims)
    assert claim.hard_time_limit(batch) == 100 + 1 + 1 + claim.HARD_LIMIT_MARGIN_SECONDS


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": 0},
        {"timeout": -1},
        {"timeout": float("nan")},
        {"timeout": True},
        {"timeout": "5"},
        {"timeout": validation.MAX_TIMEOUT_SECONDS + 1},
        {"backoff": registry.Backoff(0, 10)},
        {"backoff": registry.Backoff(20, 10)},
        {"backoff": (1, 2)},
        {"atomic": "yes"},
    ],
)
def test_bad_own_options_raise_invalid_schedule_and_store_nothing(options):
    """Every door (schedule, keyed schedule, schedule_many, a task's options) refuses them before storing."""
    with pytest.raises(exceptions.InvalidSchedule):
        api.schedule("opt.atomic", {}, delay=0, **options)
    with pytest.raises(exceptions.InvalidSchedule):
        api.schedule("opt.atomic", {}, delay=0, key="k", **options)
    with pytest.raises(exceptions.InvalidSchedule):
        api.schedule_many("opt.atomic", [{}], delay=0, **options)
    with pytest.raises(exceptions.InvalidSchedule):
        tasks.add.options(**options).enqueue(1, 2)
    assert ScheduledJob.objects.count() == 0


def test_a_replace_sets_the_options_anew_and_a_keep_leaves_them(run_sql):
    """A keyed replace stores the new call's own options; keep returns the waiting job's unchanged."""
    first = api.schedule("opt.atomic", {}, delay=60, key="k", timeout=5, atomic=False)
    api.schedule("opt.atomic", {}, delay=60, key="k", on_conflict="keep", timeout=9)
    row = ScheduledJob.objects.get(pk=first.id)
    assert (row.timeout_seconds, row.atomic) == (5.0, False)
    api.schedule("opt.atomic", {}, delay=60, key="k", backoff=registry.Backoff(2, 4))
    row = ScheduledJob.objects.get(pk=first.id)
    assert (row.timeout_seconds, row.atomic, row.backoff_base_seconds, row.backoff_cap_seconds) == (None, None, 2, 4)


def test_a_callers_timeout_never_lifts_the_worst_case_bound():
    """check_caller_limits: a longer timeout lowers the attempts allowed; a shorter one buys no more than the kind's."""
    kind = registry.get("tests.taskkit.tasks.open_to_users")  # Access(), max_attempts 2, default timeout 300 s
    validation.check_caller_limits(kind, None, max_attempts=None, priority=None, timeout_seconds=300)
    with pytest.raises(core_exceptions.OverCallerLimit):  # 2 attempts x 400 s > 600 s
        validation.check_caller_limits(kind, None, max_attempts=None, priority=None, timeout_seconds=400)
    with pytest.raises(
        core_exceptions.OverCallerLimit
    ):  # 3 attempts > the caller bound of 2, however short the timeout
        validation.check_caller_limits(kind, None, max_attempts=3, priority=None, timeout_seconds=1)


def test_a_tasks_options_carry_the_jobs_own_options_through_using_to_the_runner():
    """sleepy (per-task timeout 1 s) with options(timeout=5).using(priority=...): the row has it, the run succeeds."""
    from scheduling import testing

    result = (
        tasks.sleepy.options(timeout=5, backoff=registry.Backoff(3, 6), atomic=True).using(priority=10).enqueue(1.5)
    )
    row = ScheduledJob.objects.get(task_result_id=result.id)
    assert (row.timeout_seconds, row.backoff_base_seconds, row.backoff_cap_seconds, row.atomic) == (5, 3, 6, True)
    assert registry.get("tests.taskkit.tasks.sleepy").timeout_seconds == 1.0  # the kind keeps the task's
    plain = tasks.sleepy.options(key="plain").enqueue(0)
    assert ScheduledJob.objects.get(task_result_id=plain.id).timeout_seconds is None
    testing.run_due()
    assert tasks.sleepy.get_result(result.id).status == backends.TaskResultStatus.SUCCESSFUL
    assert ScheduledJob.objects.get(task_result_id=result.id).state == JobState.DONE
