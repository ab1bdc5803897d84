"""Handler-chosen outcomes on the due_at path: Snooze, RetryAfter, Discard, Cancel, atomic and committing.

Each job's handler writes one row, then raises what its payload asks. An atomic job's write is
rolled back with any chosen outcome (like a failure); a committing job's write stands.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection, transaction

from scheduling import api, registry
from scheduling.due_at import lease, runner, store
from scheduling.models import AttemptOutcome, JobAttempt, JobState, OutcomeCounter, ScheduledJob
from tasks.models import Execution
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


KILLER: list = []  # a raw autocommit connection that ends the chunk's session


class Planned(RuntimeError):
    """The failure the test kinds raise on purpose."""


def _choose(job: registry.Job) -> None:
    """Write one row, then do what the payload says."""
    Execution.objects.create(idempotency_key=f"{job.idempotency_key}:{job.attempt}", kind=job.kind, pid=0)
    do = job.payload.get("do")
    if do == "snooze":
        raise registry.Snooze(job.payload.get("seconds", 60))
    if do == "retry_after":
        raise registry.RetryAfter(dt.timedelta(seconds=job.payload.get("seconds", 120)), "429 from the partner")
    if do == "discard":
        raise registry.Discard("the account is closed")
    if do == "cancel":
        raise registry.Cancel("the order was withdrawn")
    if do == "fail":
        raise Planned("failing on purpose")
    if do == "hang":
        import time

        time.sleep(3)  # past its 1 s timeout
    if do == "lose":  # the chunk's session is ended by the server (as by its idle limit): the chunk is lost
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with KILLER[0].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    if do == "broken":
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:  # swallowed on purpose
            cursor.execute("SELECT 1 / 0")


OPTIONS = {"schema": {"type": "object"}, "timeout": 1, "max_attempts": 3, "batch_size": 100, "max_snoozes": 2}
registry.handler("outc.atomic", **OPTIONS)(_choose)
registry.handler("outc.committing", atomic=False, **OPTIONS)(_choose)
KINDS = ["outc.atomic", "outc.committing"]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    lease.stop()  # its thread's connection is closed before the test database is dropped


def _run(kind: str, payloads: list[dict]) -> tuple[list[int], runner.BatchReport]:
    ids = api.schedule_many(kind, payloads, delay=60)
    return ids, _run_due()


def _run_due() -> runner.BatchReport:
    support.make_due(state="pending")
    claims = store.claim_due_jobs(500)
    return runner.run_batch([(c.id, c.token) for c in claims])


def _writes(job_id: int) -> int:
    return Execution.objects.filter(idempotency_key__startswith=f"job:{job_id}:").count()


def _kept(kind: str) -> int:
    """Writes a job of ``kind`` keeps when it chooses an outcome: none if atomic, its own if committing."""
    return 0 if kind == "outc.atomic" else 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_snooze_runs_the_job_again_later_without_charging_an_attempt(kind):
    """Snooze(60): pending, due about 60 s after the attempt, attempts not charged, the attempt recorded as snoozed."""
    (job_id,), report = _run(kind, [{"do": "snooze", "seconds": 60}])
    job = ScheduledJob.objects.get(pk=job_id)
    attempt = JobAttempt.objects.get(job_id=job_id)
    assert (job.state, job.attempts, job.max_attempts) == (JobState.PENDING, 0, 3)
    assert attempt.outcome == AttemptOutcome.SNOOZED
    assert attempt.error == job.last_error == "Snooze: snoozed for 60s"
    assert dt.timedelta(seconds=55) < job.due_at - attempt.finished_at < dt.timedelta(seconds=65)
    assert _writes(job_id) == _kept(kind)
    assert report.failed == 1


SUCCESSORS: list[int] = []


def _snooze_beside_a_successor(job: registry.Job) -> None:
    """Meanwhile (another request, its own connection) the key's next job is scheduled; then snooze."""
    if not job.payload.get("snooze"):
        return  # the batch-mate

    def another_request() -> None:
        try:
            SUCCESSORS.append(api.schedule(job.kind, {}, key="acct-7", delay=3600).id)
        finally:
            connection.close()

    thread = threading.Thread(target=another_request)
    thread.start()
    thread.join()
    raise registry.Snooze(30)


registry.handler("outc.keyed.atomic", **OPTIONS)(_snooze_beside_a_successor)
registry.handler("outc.keyed.committing", atomic=False, **OPTIONS)(_snooze_beside_a_successor)


@pytest.mark.parametrize("kind", ["outc.keyed.atomic", "outc.keyed.committing"])
def test_a_snooze_beside_its_keys_waiting_successor_is_refunded_and_its_batch_mate_keeps_its_outcome(kind):
    """A running job and its key's waiting successor may coexist; snoozed, the job went back uncounted, met the
    successor in the key's index, and the unique violation lost the batch (atomic: the batch-mate's done undone,
    to run again; committing: out of run_batch, the rest left to the sweeper). Now it comes back refunded."""
    SUCCESSORS.clear()
    mate = api.schedule(kind, {}, delay=60).id
    keyed = api.schedule(kind, {"snooze": True}, key="acct-7", delay=60).id
    report = _run_due()
    assert report.succeeded == 1
    rows = {j.pk: j for j in ScheduledJob.objects.all()}
    assert set(rows) == {mate, keyed, *SUCCESSORS}
    assert rows[mate].state == JobState.DONE
    assert (rows[keyed].state, rows[keyed].attempts, rows[keyed].max_attempts) == (JobState.PENDING, 1, 4)
    assert JobAttempt.objects.get(job_id=keyed).outcome == AttemptOutcome.SNOOZED
    assert (rows[SUCCESSORS[0]].state, rows[SUCCESSORS[0]].key) == (JobState.PENDING, "acct-7")


BATCH_DONE = threading.Event()
RUNNER_PIDS: list[int] = []
REQUESTS: list[threading.Thread] = []


def _snooze_while_a_successor_is_not_committed(job: registry.Job) -> None:
    """Another request inserts the key's next job and commits only once the runner's outcome statement waits on
    it (as it did, checking for a waiting successor and seeing none), or once the batch is done."""
    if not job.payload.get("snooze"):
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        RUNNER_PIDS.append(cursor.fetchone()[0])
    inserted = threading.Event()

    def another_request() -> None:
        try:
            with transaction.atomic():  # a view under ATOMIC_REQUESTS, still at work
                SUCCESSORS.append(api.schedule(job.kind, {}, key="acct-9", delay=3600).id)
                inserted.set()
                while not BATCH_DONE.wait(0.02):
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", RUNNER_PIDS)
                        if cursor.fetchone()[0] == "Lock":
                            break
        finally:
            connection.close()

    REQUESTS.append(threading.Thread(target=another_request))
    REQUESTS[-1].start()
    assert inserted.wait(10)
    raise registry.Snooze(30)


registry.handler("outc.keyrace.atomic", **OPTIONS)(_snooze_while_a_successor_is_not_committed)
registry.handler("outc.keyrace.committing", atomic=False, **OPTIONS)(_snooze_while_a_successor_is_not_committed)


@pytest.mark.parametrize("kind", ["outc.keyrace.atomic", "outc.keyrace.committing"])
def test_a_snooze_while_its_keys_successor_is_inserted_but_not_committed_is_refunded(kind):
    """The successor's insert is not committed when the runner gives the snoozed job back: a check for a waiting
    successor saw none, uncounted the job into the key's index, waited on the insert and failed at its commit
    (the batch lost, or IntegrityError out of run_batch). A keyed job that started is refunded, read off its row."""
    SUCCESSORS.clear()
    RUNNER_PIDS.clear()
    REQUESTS.clear()
    BATCH_DONE.clear()
    mate = api.schedule(kind, {}, delay=60).id
    keyed = api.schedule(kind, {"snooze": True}, key="acct-9", delay=60).id
    try:
        report = _run_due()
    finally:
        BATCH_DONE.set()
        for request in REQUESTS:
            request.join(20)
    assert report.succeeded == 1
    rows = {j.pk: j for j in ScheduledJob.objects.all()}
    assert rows[mate].state == JobState.DONE
    assert (rows[keyed].state, rows[keyed].attempts, rows[keyed].max_attempts) == (JobState.PENDING, 1, 4)
    assert rows[SUCCESSORS[0]].state == JobState.PENDING


@pytest.mark.parametrize("kind", KINDS)
def test_a_snooze_past_the_kinds_max_snoozes_counts_as_a_failure(kind):
    """With max_snoozes=2 the third snooze is a failure: charged, retried after the backoff, the reason said."""
    (job_id,), _ = _run(kind, [{"do": "snooze"}])
    _run_due()
    assert ScheduledJob.objects.get(pk=job_id).attempts == 0, "two snoozes, nothing charged"
    _run_due()
    job = ScheduledJob.objects.get(pk=job_id)
    outcomes = list(JobAttempt.objects.filter(job_id=job_id).order_by("id").values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.SNOOZED, AttemptOutcome.SNOOZED, AttemptOutcome.FAILED]
    assert (job.state, job.attempts) == (JobState.PENDING, 1)
    assert job.last_error == runner.SNOOZED_TOO_OFTEN.format(n=2)


@pytest.mark.parametrize("kind", KINDS)
def test_retry_after_charges_the_attempt_and_waits_the_delay_given(kind):
    """RetryAfter(120 s): pending after 120 s (not the backoff), the attempt charged and recorded with its reason."""
    (job_id,), _ = _run(kind, [{"do": "retry_after", "seconds": 120}])
    job = ScheduledJob.objects.get(pk=job_id)
    attempt = JobAttempt.objects.get(job_id=job_id)
    assert (job.state, job.attempts) == (JobState.PENDING, 1)
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.RETRY_AFTER, "RetryAfter: 429 from the partner")
    assert dt.timedelta(seconds=115) < job.due_at - attempt.finished_at < dt.timedelta(seconds=125)
    assert _writes(job_id) == _kept(kind)


def test_retry_after_on_the_last_attempt_is_dead():
    """RetryAfter when the attempts are spent: dead, like any failure."""
    job_id = api.schedule("outc.atomic", {"do": "retry_after"}, delay=60, max_attempts=1).id
    _run_due()
    job = ScheduledJob.objects.get(pk=job_id)
    assert (job.state, job.last_error) == (JobState.DEAD, "RetryAfter: 429 from the partner")


@pytest.mark.parametrize("kind", KINDS)
def test_discard_makes_the_job_dead_with_its_reason_whatever_attempts_are_left(kind):
    """Discard(reason) on attempt 1 of 3: dead at once, the reason on the job and its attempt."""
    (job_id,), _ = _run(kind, [{"do": "discard"}])
    job = ScheduledJob.objects.get(pk=job_id)
    attempt = JobAttempt.objects.get(job_id=job_id)
    assert (job.state, job.attempts) == (JobState.DEAD, 1)
    assert job.finished_at is not None
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.DISCARDED, "Discard: the account is closed")
    assert _writes(job_id) == _kept(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_makes_the_job_cancelled_with_its_reason(kind):
    """Cancel(reason): cancelled, finished, the reason on the job and its attempt."""
    (job_id,), _ = _run(kind, [{"do": "cancel"}])
    job = ScheduledJob.objects.get(pk=job_id)
    attempt = JobAttempt.objects.get(job_id=job_id)
    assert job.state == JobState.CANCELLED
    assert job.finished_at is not None
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.CANCELLED, "Cancel: the order was withdrawn")
    assert _writes(job_id) == _kept(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_each_choice_holds_in_a_batch_beside_failing_slow_and_broken_siblings(kind):
    """A batch of every choice beside a failure, a timeout, a broken transaction and successes: each ends as alone."""
    payloads = [
        {},
        {"do": "snooze"},
        {"do": "fail"},
        {"do": "retry_after"},
        {"do": "hang"},
        {"do": "discard"},
        {"do": "broken"},
        {"do": "cancel"},
        {},
    ]
    ids, _ = _run(kind, payloads)
    states = dict(ScheduledJob.objects.values_list("id", "state"))
    outcomes = dict(JobAttempt.objects.values_list("job_id", "outcome"))
    expected = [
        (JobState.DONE, AttemptOutcome.SUCCEEDED),
        (JobState.PENDING, AttemptOutcome.SNOOZED),
        (JobState.PENDING, AttemptOutcome.FAILED),
        (JobState.PENDING, AttemptOutcome.RETRY_AFTER),
        (JobState.PENDING, AttemptOutcome.TIMED_OUT),
        (JobState.DEAD, AttemptOutcome.DISCARDED),
        (JobState.PENDING if kind == "outc.atomic" else JobState.DONE, None),
        (JobState.CANCELLED, AttemptOutcome.CANCELLED),
        (JobState.DONE, AttemptOutcome.SUCCEEDED),
    ]
    for job_id, (state, outcome) in zip(ids, expected, strict=True):
        assert states[job_id] == state, job_id
        if outcome is not None:
            assert outcomes[job_id] == outcome, job_id
    assert ScheduledJob.objects.get(pk=ids[1]).attempts == 0, "the snooze is not charged in a batch either"
    for i in (1, 3, 5, 7):  # the chosen outcomes: an atomic job's write rolled back, a committing job's kept
        assert _writes(ids[i]) == _kept(kind), payloads[i]
    assert _writes(ids[0]) == _writes(ids[8]) == 1


def test_the_outcome_counters_count_each_choice_sensibly():
    """job_attempts per outcome; RetryAfter is a retry, a snooze is not; Discard finishes dead, Cancel cancelled."""
    _run("outc.atomic", [{"do": "snooze"}, {"do": "retry_after"}, {"do": "discard"}, {"do": "cancel"}])
    counters = {(c.metric, c.outcome): c.value for c in OutcomeCounter.objects.filter(label="outc.atomic")}
    assert counters == {
        ("job_attempts", "snoozed"): 1,
        ("job_attempts", "retry_after"): 1,
        ("job_attempts", "discarded"): 1,
        ("job_attempts", "cancelled"): 1,
        ("job_retries", ""): 1,
        ("jobs_finished", "dead"): 1,
        ("jobs_finished", "cancelled"): 1,
    }


def test_the_choice_and_its_reason_show_on_the_job_page_and_in_the_json_api(admin_client):
    """The admin's job page and the JSON API's job detail show the attempt's outcome and the handler's reason."""
    (job_id,), _ = _run("outc.atomic", [{"do": "discard"}])
    page = admin_client.get(f"/admin/scheduling/scheduledjob/{job_id}/change/").content.decode()
    assert "discarded" in page
    assert "Discard: the account is closed" in page
    body = admin_client.get(f"/api/jobs/{job_id}").json()
    (attempt,) = body["attempt_history"]
    assert (attempt["outcome"], attempt["error"]) == ("discarded", "Discard: the account is closed")
    assert body["state"] == "dead"


def test_a_crash_of_the_chunk_commits_no_choice_and_each_choice_holds_when_run_alone(raw_connect):
    """A chunk lost beside Snooze, Cancel and Discard: all refunded, nothing written; run again, each choice holds."""
    KILLER[:] = [raw_connect(autocommit=True)]
    ids, _ = _run("outc.atomic", [{"do": "snooze"}, {"do": "cancel"}, {"do": "discard"}, {"do": "lose"}])
    rows = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("id", "state"))
    assert set(rows.values()) == {JobState.PENDING}, "the lost chunk's choices did not commit: refunded"
    assert not Execution.objects.exists()
    assert set(JobAttempt.objects.values_list("outcome", flat=True)) == {AttemptOutcome.RECLAIMED}
    ScheduledJob.objects.filter(pk=ids[3]).update(payload={})  # the crasher now succeeds
    support.make_due(ids)
    claims = store.claim_due_jobs(500)
    runner.run_batch([(c.id, c.token) for c in claims])  # run again (without a crasher this time)
    states = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("id", "state"))
    assert [states[i] for i in ids] == [JobState.PENDING, JobState.CANCELLED, JobState.DEAD, JobState.DONE]
    last = {i: JobAttempt.objects.filter(job_id=i).latest("id").outcome for i in ids[:3]}
    assert list(last.values()) == [AttemptOutcome.SNOOZED, AttemptOutcome.CANCELLED, AttemptOutcome.DISCARDED]
