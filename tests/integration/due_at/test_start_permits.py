"""Start permits (``due_at/starts.py``): a rate-limited kind's handlers start within its limit, not only its claims.

The claim holds a rate exactly (``test_rate_limits.py``); these tests hold the handlers' starts to it
too: a batch that reaches its worker late waits for room in the window of starts, or is given back
uncharged; permits taken at once on two connections never exceed the limit in any span of the period.
Each runner test claims with ``store.claim_due_jobs`` and runs ``runner.run_batch`` in this process.
"""

from __future__ import annotations

import bisect
import datetime as dt
import threading
from typing import Any

import pytest

from scheduling import api, registry, testing
from scheduling.core import aborts
from scheduling.due_at import runner, starts, store
from scheduling.models import JobAttempt, JobState, KindRate, ScheduledJob
from tasks.models import Execution
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


def _most_in_any_span(times: list[dt.datetime], seconds: float) -> int:
    """The most of ``times`` inside any half-open span ``[t, t + seconds)``."""
    times = sorted(times)
    span = dt.timedelta(seconds=seconds)
    return max((bisect.bisect_left(times, t + span, lo=i) - i for i, t in enumerate(times)), default=0)


def _fill_window(run_sql, kind: str, n: int, partition: str = "") -> dt.datetime:
    """Record ``n`` handler starts of ``kind`` at the database clock (another worker just started them)."""
    (at,) = run_sql(
        "INSERT INTO scheduling_kindrate (kind, partition, handler_starts)"
        " VALUES (%s, %s, array_fill(now(), ARRAY[%s]))"
        " ON CONFLICT (kind, partition) DO UPDATE SET handler_starts = EXCLUDED.handler_starts RETURNING now()",
        [kind, partition, n],
    )[0]
    return at


def test_a_batch_that_reaches_a_full_window_waits_for_room_before_its_handlers_start(run_sql):
    """Rate 3 a second, 3 handlers just started elsewhere: the batch's 2 jobs start only once those leave the window."""
    api.set_rate("demo.record", registry.Rate(3, per_seconds=1))
    ids = list(api.schedule_many("demo.record", [{"label": "late"}] * 2, delay=60))
    support.make_due()
    claims = store.claim_due_jobs(10)
    assert len(claims) == 2
    full_at = _fill_window(run_sql, "demo.record", 3)
    report = runner.run_batch([(c.id, c.token) for c in claims])
    assert (report.succeeded, report.failed, report.given_back) == (2, 0, 0)
    started = sorted(JobAttempt.objects.filter(job_id__in=ids).values_list("started_at", flat=True))
    assert len(started) == 2
    assert started[0] >= full_at + dt.timedelta(seconds=1), "a handler started while the window was full"
    (window,) = KindRate.objects.filter(kind="demo.record").values_list("handler_starts", flat=True)
    assert sorted(window)[-2:] == started, "each start is the instant its permit was granted"
    assert _most_in_any_span([full_at] * 3 + started, 1.0) <= 3
    assert Execution.objects.filter(idempotency_key__in=[f"job:{i}" for i in ids]).count() == 2


def test_a_job_whose_window_has_no_room_within_the_wait_is_given_back_uncharged(run_sql):
    """Rate 2 a minute, the window full: the job is not run, pending again when there is room, no attempt spent."""
    api.set_rate("demo.record", registry.Rate(2, per_seconds=60))
    job = api.schedule("demo.record", {"label": "later"}, delay=60, max_attempts=1)
    support.make_due()
    claims = store.claim_due_jobs(10)
    assert len(claims) == 1
    _fill_window(run_sql, "demo.record", 2)
    report = runner.run_batch([(c.id, c.token) for c in claims])
    assert (report.succeeded, report.failed, report.given_back) == (0, 0, 1)
    row = ScheduledJob.objects.get(pk=job.id)
    assert (row.state, row.attempts, row.token) == (JobState.PENDING, 0, None)
    assert "rate limit had no room for its start" in row.last_error
    assert not JobAttempt.objects.filter(job_id=job.id).exists()
    assert not Execution.objects.filter(idempotency_key=f"job:{job.id}").exists(), "the handler did not run"
    (late,) = run_sql("SELECT extract(epoch FROM due_at - now()) FROM scheduling_scheduledjob WHERE id = %s", [job.id])[
        0
    ]
    assert 30 < late <= 60, "due when the window has room again (the starts recorded a moment ago leave it in 60 s)"


def test_an_atomic_chunk_keeps_a_given_back_job_apart_from_its_siblings(run_sql):
    """A chunk of an unlimited kind's jobs around a given-back one: each keeps its own outcome, a failure included."""
    api.set_rate("demo.record", registry.Rate(1, per_seconds=60))
    limited = api.schedule("demo.record", {"label": "limited"}, delay=60, priority=5)
    ok = api.schedule("demo.noop", {}, delay=60)
    failing = api.schedule("demo.fail", {}, delay=60, max_attempts=3)
    support.make_due()
    claims = store.claim_due_jobs(10)
    assert len(claims) == 3
    _fill_window(run_sql, "demo.record", 1)
    report = runner.run_batch([(c.id, c.token) for c in claims])
    assert (report.succeeded, report.failed, report.given_back) == (1, 1, 1)
    states = dict(ScheduledJob.objects.filter(id__in=[limited.id, ok.id, failing.id]).values_list("id", "state"))
    assert states == {limited.id: JobState.PENDING, ok.id: JobState.DONE, failing.id: JobState.PENDING}
    assert ScheduledJob.objects.get(pk=limited.id).attempts == 0
    assert ScheduledJob.objects.get(pk=failing.id).attempts == 1


def test_a_kind_without_a_rate_takes_no_permit():
    """No rate: the job starts without asking (no window row is written or read)."""
    api.schedule_many("demo.record", [{}] * 3, delay=0)
    support.make_due()
    claims = store.claim_due_jobs(10)
    started = store.start_jobs([(c.id, c.token) for c in claims], "test")
    assert [j.rate_partition for j in started] == [None, None, None]
    assert not KindRate.objects.exists()


def test_a_partitioned_rate_starts_in_its_partitions_window(run_sql):
    """Partitioned by partner: a full window for partner a holds a's job back, never b's."""
    api.set_rate("demo.record", registry.Rate(1, per_seconds=60, partition_by="partner"))
    a = api.schedule("demo.record", {"partner": "a"}, delay=60)
    b = api.schedule("demo.record", {"partner": "b"}, delay=60)
    support.make_due()
    claims = store.claim_due_jobs(10)
    assert len(claims) == 2
    _fill_window(run_sql, "demo.record", 1, partition="a")
    runner.run_batch([(c.id, c.token) for c in claims])
    states = dict(ScheduledJob.objects.filter(id__in=[a.id, b.id]).values_list("id", "state"))
    assert states == {a.id: JobState.PENDING, b.id: JobState.DONE}
    windows = dict(KindRate.objects.filter(kind="demo.record").values_list("partition", "handler_starts"))
    assert len(windows["a"]) == 1
    assert len(windows["b"]) == 1


def test_a_rate_removed_after_the_claim_lets_the_job_start_without_a_permit(run_sql):
    """The batch reads the kind's rate as it is when it starts: lifted, the full window no longer holds the job back."""
    api.set_rate("demo.record", registry.Rate(1, per_seconds=60))
    job = api.schedule("demo.record", {}, delay=60)
    support.make_due()
    claims = store.claim_due_jobs(10)
    _fill_window(run_sql, "demo.record", 1)
    api.set_rate("demo.record", None)
    runner.run_batch([(c.id, c.token) for c in claims])
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DONE
    assert len(KindRate.objects.get(kind="demo.record").handler_starts) == 1, "no permit taken"


def test_permits_asked_at_once_on_two_connections_never_exceed_the_limit(raw_connect):
    """Two processes' connections, 12 permits each on a barrier, rate 5 a second: at most 5 in any 1 s span."""
    api.set_rate("demo.record", registry.Rate(5, per_seconds=1))
    KindRate.objects.create(kind="demo.record")
    sql = store.SQL["take_start"]
    params = {"kind": "demo.record", "partition": ""}
    conns = [raw_connect(autocommit=True) for _ in range(2)]
    barrier = threading.Barrier(2)
    granted: list[dt.datetime] = []
    refused: list[float] = []
    lock = threading.Lock()

    def ask(conn: Any) -> None:
        for _ in range(12):
            barrier.wait()
            with conn.cursor() as cur:
                cur.execute(sql, params)
                at, ok, wait = cur.fetchone()
            with lock:
                (granted.append(at) if ok else refused.append(wait))

    threads = [threading.Thread(target=ask, args=(conn,)) for conn in conns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(granted) + len(refused) == 24
    assert _most_in_any_span(granted, 1.0) <= 5, "never more than the limit in any second"
    assert len(granted) >= 5, "the first second's 5 are granted (more only if the asking took over a second)"
    assert all(0 < w <= 1 for w in refused)
    (window,) = KindRate.objects.filter(kind="demo.record").values_list("handler_starts", flat=True)
    assert sorted(window) == sorted(granted)


def test_a_permit_that_cannot_be_asked_lets_the_job_start_on_its_claims_rate(monkeypatch):
    """The permit's connection failing: the job runs (the claim's limit alone holds), the connection reopened next."""
    api.set_rate("demo.record", registry.Rate(5, per_seconds=1))
    job = api.schedule("demo.record", {}, delay=60)
    support.make_due()
    claims = store.claim_due_jobs(10)
    monkeypatch.setattr(starts.locks, "dedicated_connection", _refused_connection)
    runner.run_batch([(c.id, c.token) for c in claims])
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DONE


def _refused_connection(application_name: str = "", lock_timeout_ms: int = 0) -> Any:
    import psycopg2

    return psycopg2.connect("host=127.0.0.1 port=1 connect_timeout=1")


def test_a_permit_asked_after_the_rate_was_lifted_is_granted_and_empties_the_window(run_sql):
    """Lifted between the batch's start and the permit: granted at once, the old window forgotten."""
    api.set_rate("demo.record", registry.Rate(1, per_seconds=60))
    _fill_window(run_sql, "demo.record", 1)
    assert starts.take("demo.record", "").granted is False
    api.set_rate("demo.record", None)
    permit = starts.take("demo.record", "")
    assert permit is not None
    assert permit.granted
    assert permit.wait_seconds == 0
    assert KindRate.objects.get(kind="demo.record").handler_starts == []


@pytest.mark.django_db(transaction=False)
def test_run_due_inside_a_test_transaction_takes_no_permit(caplog):
    """Inside a TestCase's transaction the claim's window row is uncommitted: no permit is asked (none could be)."""
    api.set_rate("demo.record", registry.Rate(5, per_seconds=1))
    job = api.schedule("demo.record", {}, delay=0)
    report = testing.run_due()
    assert report.succeeded == 1
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DONE
    assert KindRate.objects.get(kind="demo.record").handler_starts == []
    assert "start permit not taken" not in caplog.text, "the permit was asked, and waited on the test's row lock"


def test_an_abort_asked_while_a_job_waits_for_its_permit_cancels_it(run_sql):
    """Aborted before its permit: cancelled as aborted, not given back to run later."""
    api.set_rate("demo.record", registry.Rate(1, per_seconds=60))
    job = api.schedule("demo.record", {}, delay=60)
    support.make_due()
    (claim,) = store.claim_due_jobs(10)
    _fill_window(run_sql, "demo.record", 1)
    aborts.request(claim.id, claim.token, "aborted by the test")
    runner.run_batch([(claim.id, claim.token)])
    row = ScheduledJob.objects.get(pk=job.id)
    assert row.state == JobState.CANCELLED
    assert not Execution.objects.filter(idempotency_key=f"job:{job.id}").exists()
    assert len(KindRate.objects.get(kind="demo.record").handler_starts) == 1, "no permit taken for it"
