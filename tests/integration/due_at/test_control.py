"""The due_at engine under load rules: back-pressure sized to the queue's room, leases that start
with the work, atomic batches, and the control loop's leadership (real PostgreSQL and Redis)."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from scheduling import api, registry
from scheduling.core import broker, conf, holdings
from scheduling.due_at import claim, control, runner, store, sweep
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests import support
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

COMMITTED: list[str] = []  # on_commit callbacks of the test kinds, in the order they ran


class Planned(RuntimeError):
    """The failure the test kinds raise on purpose."""


def _write_then_maybe_fail(job: registry.Job) -> None:
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=0)
    transaction.on_commit(lambda: COMMITTED.append(job.idempotency_key))
    if job.payload.get("fail"):
        raise Planned("failing after a write, on purpose")


registry.handler("test.atomic_write", schema={"type": "object"}, timeout=10, max_attempts=2, batch_size=10)(
    _write_then_maybe_fail
)
registry.handler(
    "test.committing_write", schema={"type": "object"}, timeout=10, max_attempts=2, batch_size=10, atomic=False
)(_write_then_maybe_fail)
registry.handler("test.one_per_batch", schema={"type": "object"}, timeout=10, batch_size=1)(_write_then_maybe_fail)


@pytest.fixture
def queue() -> Iterator[str]:
    """The job queue's Redis key for this run, empty before and after the test."""
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"
    client = broker.client()
    client.delete(key)
    COMMITTED.clear()
    yield key
    client.delete(key)


def _claimed_batches(queue: str) -> list[list[list]]:
    """The claims carried by the run_batch messages waiting in the queue, oldest first."""
    raw = broker.client().lrange(queue, 0, -1)
    return [broker.message_args(m)[1][0] for m in reversed(raw)]


def test_a_claim_never_sends_more_batches_than_the_queue_has_room_for(queue, run_sql):
    """With room for 2 messages, 5 due one-per-batch jobs: 2 claimed and sent, the other 3 never claimed."""
    bound = conf.get().max_queued_batches
    broker.client().rpush(queue, *[b"placeholder"] * (bound - 2))
    for _ in range(5):
        api.schedule("test.one_per_batch", {}, delay=60)
    support.make_due(state="pending")
    report = claim.claim_and_dispatch()
    assert (report.claimed, report.batches, report.given_back) == (2, 2, 0), "whole batches for the room"
    assert report.more_due
    assert broker.queued_messages() == bound, "the queue is exactly full, never over"
    pending = ScheduledJob.objects.filter(state=JobState.PENDING)
    assert pending.count() == 3
    assert set(pending.values_list("attempts", flat=True)) == {0}
    full = claim.claim_and_dispatch()
    assert (full.claimed, full.queue_full) == (0, True)


def test_a_claim_is_sized_to_the_room_in_rows(queue, run_sql):
    """The rows claimed are at most room x the default batch size, however many are due."""
    bound = conf.get().max_queued_batches
    broker.client().rpush(queue, *[b"placeholder"] * (bound - 1))
    api.schedule_many("test.atomic_write", [{}] * 25, delay=60)
    support.make_due(state="pending")
    with override_settings(SCHEDULING_DEFAULT_BATCH_SIZE=10):
        report = claim.claim_and_dispatch()
    assert (report.claimed, report.batches) == (10, 1)
    assert ScheduledJob.objects.filter(state=JobState.CLAIMED).count() == 10


def _sent_long_ago(run_sql, **options: Any) -> ScheduledJob:
    """A job claimed and sent (its run message in the queue), its claim 10 minutes old: past any lease."""
    job = api.schedule("test.atomic_write", {}, delay=60, **options)
    support.make_due(state="pending")
    assert claim.claim_and_dispatch().batches == 1
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '10 minutes' WHERE id = %s", [job.id])
    return job


def test_an_unstarted_claim_is_swept_only_once_its_message_is_gone(queue, run_sql):
    """A claim waiting in the queue past its lease stays; once its message is lost it goes back to pending."""
    job = _sent_long_ago(run_sql)
    assert sweep.reclaim_expired() == (0, 0), "its message is still queued: it is waiting, not lost"
    broker.client().delete(queue)  # the broker lost it
    assert sweep.reclaim_expired() == (0, 0), "missing at one sweep: it may be between a worker's two steps"
    assert sweep.reclaim_expired() == (1, 0), "missing at two in a row: lost"
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING
    assert JobAttempt.objects.get(job_id=job.id).outcome == AttemptOutcome.RECLAIMED


def test_a_look_older_than_a_few_sweep_intervals_confirms_nothing(queue, run_sql):
    """A process that stopped leading and leads again does not confirm a loss with its last term's look."""
    job = _sent_long_ago(run_sql)
    broker.client().delete(queue)
    assert sweep.reclaim_expired() == (0, 0)
    too_old = max(sweep.UNSEEN_MAX_AGE * conf.get().sweep_interval_seconds, sweep.UNSEEN_MAX_AGE_FLOOR_SECONDS) + 1
    sweep._last_look = dataclasses.replace(sweep._last_look, at=sweep._last_look.at - too_old)
    assert sweep.reclaim_expired() == (0, 0), "the old look is forgotten: this one is the first"
    assert sweep.reclaim_expired() == (1, 0)
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING


@override_settings(SCHEDULING_SWEEP_INTERVAL_SECONDS=0)
def test_with_a_sweep_on_every_turn_a_lost_claim_is_still_taken_back(queue, run_sql):
    """A look is fresh for at least UNSEEN_MAX_AGE_FLOOR_SECONDS, however short the sweep interval."""
    job = _sent_long_ago(run_sql)
    broker.client().delete(queue)
    assert conf.get().sweep_interval_seconds == 0
    assert sweep.reclaim_expired() == (0, 0)
    assert sweep.reclaim_expired() == (1, 0)
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING


def test_a_claim_whose_message_a_worker_is_taking_is_not_taken_for_lost(queue, run_sql):
    """A worker takes a message in two steps, off the queue and then into ``unacked``: a sweep between
    them finds it nowhere, and does not take its claim back (the rolling-deploy test lost a job so)."""
    job = _sent_long_ago(run_sql, max_attempts=1)
    worker_id = f"taking-{uuid.uuid4().hex[:6]}"
    client = broker.client()
    client.sadd(holdings._key(holdings.HOLDERS_KEY), worker_id)
    client.set(holdings._key(holdings.PRESENCE_KEY.format(id=worker_id)), "{}", px=60_000)
    worker = kombu.Connection(settings.CELERY_BROKER_URL, transport_options=broker.transport_options())
    try:
        channel = worker.channel()
        holdings.track(channel.qos, worker_id)
        raw = channel._get(broker.default_queue())  # kombu's first step (a worker's BRPOP): off the queue
        assert client.llen(queue) == 0
        assert job.id not in (holdings.claim_ids_in_flight() or ()), "the message is nowhere the sweeper looks"
        assert sweep.reclaim_expired() == (0, 0), "its message is between two steps of a delivery, not lost"
        (token,) = ScheduledJob.objects.filter(pk=job.id).values_list("token", flat=True)
        assert str(token) in sweep._last_look.tokens, "seen missing once: the next sweep would confirm it"
        message = channel.Message(raw, channel=channel)
        channel.qos.append(message, message.delivery_tag)  # kombu's second step: recorded as held
        assert sweep.reclaim_expired() == (0, 0), "held by a live worker"
        assert ScheduledJob.objects.get(pk=job.id).state == JobState.CLAIMED
        channel.basic_ack(message.delivery_tag)
    finally:
        worker.release()
        client.srem(holdings._key(holdings.HOLDERS_KEY), worker_id)
        client.delete(holdings._key(holdings.PRESENCE_KEY.format(id=worker_id)))
    assert not JobAttempt.objects.filter(job_id=job.id).exists(), "nothing was charged"


def test_the_lease_of_a_claim_starts_when_its_batch_starts(queue, run_sql):
    """Claimed: no heartbeat. Started: heartbeat set, and the sweeper judges it by the heartbeat from then on."""
    job = api.schedule("test.atomic_write", {}, delay=60)
    support.make_due(state="pending")
    (claimed,) = store.claim_due_jobs(10)
    assert ScheduledJob.objects.get(pk=job.id).heartbeat_at is None
    assert len(store.start_jobs([(claimed.id, claimed.token)], "test:1")) == 1
    assert ScheduledJob.objects.get(pk=job.id).heartbeat_at is not None
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '10 minutes' WHERE id = %s", [job.id])
    assert sweep.reclaim_expired() == (0, 0), "a fresh heartbeat keeps a started claim however old the claim"
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '10 minutes' WHERE id = %s", [job.id])
    assert sweep.reclaim_expired() == (1, 0)


def _run_claimed(run_sql) -> runner.BatchReport:
    support.make_due(state="pending")
    claims = store.claim_due_jobs(100)
    return runner.run_batch([(c.id, c.token) for c in claims])


def test_an_atomic_batch_commits_each_job_with_its_outcome_and_rolls_a_failure_back(run_sql):
    """Atomic kind: a failing job rolls back its own writes only; the others commit once, in one chunk."""
    ok = api.schedule_many("test.atomic_write", [{}, {}], delay=60)
    bad = api.schedule("test.atomic_write", {"fail": True}, delay=60)
    report = _run_claimed(run_sql)
    assert (report.succeeded, report.failed, report.chunks) == (2, 1, 1)
    assert sorted(Execution.objects.values_list("idempotency_key", flat=True)) == sorted(f"job:{i}" for i in ok)
    assert ScheduledJob.objects.get(pk=bad.id).state == JobState.PENDING, "failed: retried later"
    assert JobAttempt.objects.get(job_id=bad.id).error.startswith("Planned: failing after a write")
    assert sorted(COMMITTED) == sorted(f"job:{i}" for i in ok), "on_commit runs once, for committed jobs only"


def test_a_non_atomic_kind_keeps_the_writes_of_a_failed_job(run_sql):
    """atomic=False: a handler's writes commit as it goes, so a failed attempt's row stays."""
    bad = api.schedule("test.committing_write", {"fail": True}, delay=60)
    report = _run_claimed(run_sql)
    assert (report.succeeded, report.failed, report.chunks) == (0, 1, 0)
    assert list(Execution.objects.values_list("idempotency_key", flat=True)) == [f"job:{bad.id}"]


def test_an_atomic_chunk_skips_a_claim_taken_back_before_it_ran(run_sql):
    """A claim swept between start and its chunk runs nothing: no write, no outcome under the old token."""
    job = api.schedule("test.atomic_write", {}, delay=60)
    support.make_due(state="pending")
    (claimed,) = store.claim_due_jobs(10)
    (started,) = store.start_jobs([(claimed.id, claimed.token)], "test:1")
    run_sql("UPDATE scheduling_scheduledjob SET token = gen_random_uuid() WHERE id = %s", [job.id])
    report = runner.BatchReport()
    runner._run_atomic(
        [started],
        {"test.atomic_write": registry.get("test.atomic_write")},
        runner._DbClock(started.db_now),
        report,
        set(),
    )
    assert (report.succeeded, report.stale) == (0, 1)
    assert not Execution.objects.exists()


def test_one_control_loop_leads_and_stops_within_two_seconds(queue, run_sql):
    """Two loops in one process: exactly one leads and claims; both stop within STOP_JOIN_SECONDS."""
    loops = [control.ControlLoop(), control.ControlLoop()]
    for loop in loops:
        loop.start()
    try:
        api.schedule("test.atomic_write", {}, delay=0)
        wait_for(lambda: sum(loop.counters.claimed for loop in loops) == 1, 20, message="the job to be claimed")
        leaders = [loop for loop in loops if loop.counters.led_turns]
        assert len(leaders) == 1, "one leader at a time"
        assert leaders[0].counters.sweeps >= 1, "the leader sweeps in the same loop"
    finally:
        stopped = [loop.stop() for loop in loops]
    assert stopped == [True, True]
    assert all(not loop.thread.is_alive() for loop in loops if loop.thread is not None)


def test_the_leader_sweeps_on_schedule_while_the_queue_is_full(queue, run_sql):
    """Back-pressure holds claims back, not sweeps: a full queue still sees dead claims taken back."""
    bound = conf.get().max_queued_batches
    broker.client().rpush(queue, *[b"placeholder"] * bound)
    job = api.schedule("test.atomic_write", {}, delay=60)
    support.make_due(state="pending")
    (claimed,) = store.claim_due_jobs(10)
    store.start_jobs([(claimed.id, claimed.token)], "gone:1")
    run_sql("UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '10 minutes' WHERE id = %s", [job.id])
    loop = control.ControlLoop()
    stop = threading.Timer(30, loop.stopping.set)
    stop.start()
    loop.start()
    try:
        wait_for(lambda: loop.counters.reclaimed == 1, 20, message="the dead claim to be swept")
        assert loop.counters.claimed == 0, "nothing claimed while the queue is full"
        assert ScheduledJob.objects.get(pk=job.id).state == JobState.PENDING
    finally:
        stop.cancel()
        assert loop.stop()


@override_settings(SCHEDULING_RETENTION_DAYS=0, SCHEDULING_PRUNE_BATCH_SIZE=5)
def test_the_leader_prunes_history_a_slice_a_turn(queue, run_sql, monkeypatch):
    """History to prune is cut into slices of one statement, one slice a turn while more is left,
    then nothing until PRUNE_EVERY_SECONDS: a turn never holds claims up for the whole history."""
    for _ in range(12):
        api.schedule("demo.noop", {}, delay=3600)
    run_sql("UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now() - interval '1 second'")
    monkeypatch.setattr(control, "PRUNE_SLICE_SECONDS", 0.0)  # exactly one statement a slice
    loop = control.ControlLoop()
    assert loop.leadership.lead()
    try:
        left = []
        ended = 0.0
        for turn in range(4):
            before = time.monotonic()
            loop.turn()
            if turn < 2:
                assert loop._next_prune <= time.monotonic() + control.PRUNE_AGAIN_SECONDS, "more left: again soon"
            else:
                ended = ended or before
                assert loop._next_prune >= ended + control.PRUNE_EVERY_SECONDS, "nothing left: the next run in a minute"
            left.append(ScheduledJob.objects.count())
            loop.stopping.wait(control.PRUNE_AGAIN_SECONDS + 0.01)
        assert left == [7, 2, 0, 0], "5 rows a turn, then the short slice that ends it, then nothing"
        assert (loop.counters.pruned, loop.counters.prune_slices) == (12, 3)
    finally:
        loop.leadership.resign()
        connection.close()  # the turn bounded this session (lock_timeout...) for the loop: not for later tests


def test_a_leader_with_history_left_to_prune_wakes_for_the_next_slice(queue):
    """An idle leader's wait ends at the next prune slice (0.1 s while more is left), not at the 0.5 s step."""
    loop = control.ControlLoop()
    loop._next_sweep = time.monotonic() + 60
    loop._next_prune = time.monotonic() + control.PRUNE_AGAIN_SECONDS
    assert loop._until_next_due(conf.get().claim_interval_seconds) <= control.PRUNE_AGAIN_SECONDS
    loop._next_prune = time.monotonic() + control.PRUNE_EVERY_SECONDS
    assert loop._until_next_due(conf.get().claim_interval_seconds) == control.WAIT_STEP_SECONDS


def test_the_leader_claims_rate_limited_kinds_once_per_step_and_other_kinds_on_every_turn(queue, monkeypatch):
    """A turn sooner than RATE_STEP_SECONDS after the last claim of the rate-limited kinds claims the other
    kinds only (no read of the rate-limited backlog); the first turn after it takes the rate-limited kind too."""
    api.schedule_many("demo.record", [{}] * 5, delay=60)
    api.set_rate("demo.record", registry.Rate(100, per_seconds=3600))
    support.make_due(state="pending")
    loop = control.ControlLoop()
    assert loop.leadership.lead()
    try:
        monkeypatch.setattr(control, "RATE_STEP_SECONDS", 60.0)
        loop._last_rate_claim = time.monotonic()  # a rate claim just ran
        api.schedule("demo.noop", {}, delay=0)
        loop.turn()
        assert loop.counters.rate_claims == 0
        assert {j.kind: j.state for j in ScheduledJob.objects.filter(state="claimed")} == {"demo.noop": "claimed"}
        loop._last_rate_claim = time.monotonic() - 61.0  # the step has passed
        loop.turn()
        assert loop.counters.rate_claims == 1
        assert ScheduledJob.objects.filter(kind="demo.record", state="claimed").count() == 5
    finally:
        loop.leadership.resign()
        connection.close()  # the turn bounded this session (lock_timeout...) for the loop: not for later tests


def test_turns_between_the_rate_limited_kinds_claims_keep_the_last_reading_of_their_backlog(queue, monkeypatch):
    """Only a turn that claims the rate-limited kinds reads whether one waits (rate_limited_due); another
    kind's turn within the step keeps that reading, so it still waits for the step, not its next due time."""
    api.set_rate("demo.record", registry.Rate(2, per_seconds=3600))
    api.schedule_many("demo.record", [{}] * 3, delay=0)
    reads: list[float | None] = []
    read = store.rate_limited_due

    def counted(**kwargs: Any) -> float | None:
        reads.append(read(**kwargs))
        return reads[-1]

    monkeypatch.setattr(store, "rate_limited_due", counted)
    loop = control.ControlLoop()
    assert loop.leadership.lead()
    try:
        loop.turn()  # takes the window's two; the third waits for its window
        assert reads == [pytest.approx(1800.0)], "the turn that claimed the rate-limited kind read its backlog"
        assert loop._rate_waiting

        monkeypatch.setattr(control, "RATE_STEP_SECONDS", 60.0)
        loop._last_rate_claim = time.monotonic()  # within the step: a turn of the other kinds
        api.schedule("demo.noop", {}, delay=0)
        loop.turn()
        assert ScheduledJob.objects.filter(kind="demo.noop", state="claimed").count() == 1
        assert len(reads) == 1, "another kind's turn kept the reading"
        assert loop._rate_waiting, "and still knows the rate-limited kind waits"

        loop._last_rate_claim = -float("inf")  # the step has passed: the rate-limited kind's turn
        loop.turn()
        assert loop.counters.rate_claims == 2
        assert reads == [pytest.approx(1800.0)] * 2, "the turn that claims it reads again"
    finally:
        loop.leadership.resign()
        connection.close()


def test_a_reading_of_the_rate_limited_backlog_is_not_kept_past_a_turn_that_claimed_them(queue):
    """A turn that claims the rate-limited kinds and returns before reading (a full queue) drops the last
    reading: another kind's turn then reads afresh instead of sleeping on an old refill interval."""
    api.set_rate("demo.record", registry.Rate(2, per_seconds=3600))
    api.schedule_many("demo.record", [{}] * 3, delay=0)
    loop = control.ControlLoop()
    assert loop.leadership.lead()
    try:
        loop._refill = 0.5  # a reading from an earlier turn (another rate since, say)
        client = broker.client()
        client.rpush(queue, *[b"placeholder"] * (conf.get().max_queued_batches - client.llen(queue)))
        loop.turn()  # claims the rate-limited kinds, finds the queue full, returns before reading
        assert loop.counters.rate_claims == 1
        assert loop._refill is None, "dropped: the next turn reads it again"
    finally:
        loop.leadership.resign()
        connection.close()


def test_while_a_rate_limited_kind_waits_its_turns_take_any_room_the_queue_has(queue, monkeypatch, run_sql):
    """Other turns claim once the queue has room for a refill (half its bound); a turn that claims a
    rate-limited kind waiting for its window takes a single free message, so a freed start is not lost."""
    api.set_rate("demo.record", registry.Rate(2, per_seconds=3600))
    api.schedule_many("demo.record", [{}] * 3, delay=0)
    loop = control.ControlLoop()
    assert loop.leadership.lead()
    try:
        loop.turn()  # takes the window's two; the third waits for its window
        assert ScheduledJob.objects.filter(kind="demo.record", state="claimed").count() == 2
        assert loop._rate_waiting, "the loop saw the kind waiting"
        bound = conf.get().max_queued_batches
        assert claim.refill_room() == 2 <= bound - 1
        client = broker.client()
        client.rpush(queue, *[b"placeholder"] * (bound - 1 - client.llen(queue)))  # room for one batch
        run_sql("DELETE FROM scheduling_kindrate")  # the window's period has passed: it has room again
        monkeypatch.setattr(control, "BACKPRESSURE_PAUSE_SECONDS", 0.0)

        monkeypatch.setattr(control, "RATE_STEP_SECONDS", 60.0)  # a slow turn must not reach the next step
        loop._last_rate_claim = time.monotonic()  # within the step: a turn of the other kinds
        loop.turn()
        assert loop.counters.rate_claims == 1, "no claim of the rate-limited kinds"
        assert ScheduledJob.objects.filter(kind="demo.record", state="claimed").count() == 2

        loop._last_rate_claim = -float("inf")  # the step has passed: the rate-limited kind's turn
        loop.turn()
        assert loop.counters.rate_claims == 2
        assert ScheduledJob.objects.filter(kind="demo.record", state="claimed").count() == 3
        assert client.llen(queue) == bound, "one message, in the one free place: the bound holds"
    finally:
        loop.leadership.resign()
        connection.close()
