"""The claim: SKIP LOCKED disjointness, exactly-once under concurrency, races with cancel."""

from __future__ import annotations

import threading

import pytest

from scheduling import api, exceptions
from scheduling.due_at import store
from scheduling.models import JobState, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


def _insert_due(run_sql, n: int, kind: str = "demo.noop") -> None:
    run_sql(
        "INSERT INTO scheduling_scheduledjob (kind, payload, due_at, state, lease_seconds, attempts, max_attempts,"
        " last_error, claimed_by, created_at, updated_at)"
        " SELECT %s, '{}'::jsonb, now() - make_interval(secs => g), 'pending', 60, 0, 3, '', '', now(), now()"
        " FROM generate_series(1, %s) AS g",
        [kind, n],
    )


def test_two_connections_claim_disjoint_rows(raw_connect, run_sql):
    """Two open transactions claiming at once get disjoint rows (SKIP LOCKED), neither waits."""
    _insert_due(run_sql, 10)
    claim_sql = store.SQL["claim_due_jobs"]
    a, b = raw_connect(), raw_connect()
    with a.cursor() as ca, b.cursor() as cb:
        ca.execute(claim_sql, store.claim_params(6))
        got_a = {row[0] for row in ca.fetchall()}
        cb.execute("SET LOCAL lock_timeout = '2s'")
        cb.execute(claim_sql, store.claim_params(6))
        got_b = {row[0] for row in cb.fetchall()}
    a.commit()
    b.commit()
    assert len(got_a) == 6
    assert len(got_b) == 4
    assert not got_a & got_b


def test_four_claimers_over_10000_rows_claim_each_exactly_once(raw_connect, run_sql):
    """Four concurrent claimers drain 10,000 due rows; every row is claimed once and only once."""
    _insert_due(run_sql, 10_000)
    claim_sql = store.SQL["claim_due_jobs"]
    conns = [raw_connect(autocommit=True) for _ in range(4)]
    results: list[list[int]] = [[] for _ in conns]
    barrier = threading.Barrier(len(conns))

    def claimer(i: int) -> None:
        barrier.wait()
        with conns[i].cursor() as cur:
            while True:
                cur.execute(claim_sql, store.claim_params(50))
                rows = cur.fetchall()
                if not rows:
                    return
                results[i].extend(row[0] for row in rows)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    claimed = [job_id for r in results for job_id in r]
    assert len(claimed) == 10_000
    assert len(set(claimed)) == 10_000
    assert sum(1 for r in results if r) >= 2, "the claimers should have shared the work"
    assert (
        run_sql("SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'claimed' AND attempts = 1")[0][0] == 10_000
    )


def test_claim_respects_the_database_clock(run_sql):
    """A row due a second from now (database clock) is not claimed yet."""
    api.schedule("demo.noop", {}, delay=5)
    assert store.claim_due_jobs(10) == []
    support.make_due()
    assert len(store.claim_due_jobs(10)) == 1


def test_each_claim_gets_a_new_token(run_sql):
    """A reclaimed job gets a different token (fencing)."""
    _insert_due(run_sql, 1)
    (first,) = store.claim_due_jobs(1)
    run_sql("UPDATE scheduling_scheduledjob SET state = 'pending', token = NULL, claimed_at = NULL")
    (second,) = store.claim_due_jobs(1)
    assert first.id == second.id
    assert first.token != second.token


@pytest.mark.parametrize("repeat", range(5))
def test_cancel_racing_a_claim_ends_in_exactly_one(raw_connect, run_sql, repeat):
    """A cancel and a claim racing on one due row: exactly one of them wins, and the loser says so."""
    job = api.schedule("demo.noop", {}, delay=0)
    support.make_due(job.id, ago="1 s")
    claim_sql = store.SQL["claim_due_jobs"]
    conn = raw_connect(autocommit=True)
    barrier = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def claimer() -> None:
        barrier.wait()
        with conn.cursor() as cur:
            cur.execute(claim_sql, store.claim_params(1))
            outcome["claimed"] = [row[0] for row in cur.fetchall()]

    def canceller() -> None:
        from django.db import connection

        barrier.wait()
        try:
            api.cancel(job.id)
            outcome["cancelled"] = True
        except exceptions.JobNotCancellable as exc:
            outcome["cancelled"] = False
            outcome["cancel_error_state"] = exc.state
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer), threading.Thread(target=canceller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    state = ScheduledJob.objects.get(pk=job.id).state
    claimed = outcome["claimed"] == [job.id]
    assert claimed != outcome["cancelled"], outcome
    if claimed:
        assert state == JobState.CLAIMED
        assert outcome["cancel_error_state"] == "claimed"
    else:
        assert state == JobState.CANCELLED


def test_claim_waits_while_the_queue_is_full(run_sql):
    """Back-pressure: with SCHEDULING_MAX_QUEUED_BATCHES messages waiting, a claim takes nothing."""
    from django.conf import settings

    from scheduling.core import broker, conf
    from scheduling.due_at import claim

    _insert_due(run_sql, 3)
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"
    client = broker.client()
    client.delete(key)
    client.rpush(key, *[b"placeholder"] * conf.get().max_queued_batches)
    try:
        report = claim.claim_and_dispatch()
        assert report.claimed == 0
        assert ScheduledJob.objects.filter(state=JobState.CLAIMED).count() == 0
    finally:
        client.delete(key)
    try:
        report = claim.claim_and_dispatch()
        assert (report.claimed, report.batches) == (3, 1)
        assert client.llen(key) == 1, "one run_batch message for the three rows"
        claimed = ScheduledJob.objects.filter(state=JobState.CLAIMED)
        assert claimed.count() == 3
        assert not claimed.filter(heartbeat_at__isnull=False).exists(), "the lease starts when the batch starts"
    finally:
        client.delete(key)


def _queue_key() -> str:
    from django.conf import settings

    return f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"


def _sent_batches(client) -> list[list[int]]:
    """The job ids of the run_batch messages in the queue, in the order workers take them (kombu: LPUSH, BRPOP)."""
    from scheduling.core import broker

    out = []
    for raw in reversed(client.lrange(_queue_key(), 0, -1)):
        parsed = broker.message_args(raw)
        if parsed is not None:
            out.append([pair[0] for pair in parsed[1][0]])
    return out


def test_batches_are_sent_and_run_most_urgent_first(run_sql):
    """300 priority-0 and 10 priority-9 jobs due, the kind resumed: the priority-9 jobs are sent and start first."""
    from scheduling.core import broker
    from scheduling.due_at import claim, runner
    from tasks.models import Execution

    api.pause("demo.record")
    low = api.schedule_many("demo.record", [{}] * 300, delay=60)
    high = api.schedule_many("demo.record", [{}] * 10, delay=60, priority=9)
    run_sql(
        "UPDATE scheduling_scheduledjob AS j SET due_at = now() - interval '1 hour' + t.n * interval '1 ms'"
        " FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(id, n) WHERE j.id = t.id",
        [low + high],
    )
    api.resume("demo.record")
    client = broker.client()
    client.delete(_queue_key())
    try:
        report = claim.claim_and_dispatch()
        batches = _sent_batches(client)
        assert report.batches == len(batches) >= 2
        assert batches[0][:10] == high, "the first message starts with the priority-9 jobs"
        assert [job_id for batch in batches for job_id in batch] == high + low[: report.claimed - 10], "then FIFO"
        tokens = dict(ScheduledJob.objects.filter(pk__in=batches[0]).values_list("id", "token"))
        runner.run_batch([(job_id, str(tokens[job_id])) for job_id in batches[0]])
        ran = list(Execution.objects.order_by("id").values_list("idempotency_key", flat=True))
        assert ran[:10] == [f"job:{job_id}" for job_id in high], "they started first within their batch too"
    finally:
        client.delete(_queue_key())


def test_a_batch_size_1_kind_is_claimed_one_row_per_free_message(run_sql):
    """Queue room for one message, 100 batch_size=1 jobs and one urgent: each turn claims one row, gives none back."""
    from scheduling.core import broker, conf
    from scheduling.due_at import claim

    routine = api.schedule_many("demo.sleep", [{}] * 100, delay=60)
    urgent = api.schedule("demo.sleep", {}, delay=60, priority=9)
    support.make_due(ago="1 minute")
    client = broker.client()
    key = _queue_key()
    client.delete(key)
    client.rpush(key, *[b"placeholder"] * (conf.get().max_queued_batches - 1))
    try:
        report = claim.claim_and_dispatch()
        assert (report.claimed, report.batches, report.given_back) == (1, 1, 0)
        assert _sent_batches(client) == [[urgent.id]], "the urgent job was sent, under a full queue"
        for turn in range(5):
            client.lpop(key)  # a worker took the message: room for one more
            report = claim.claim_and_dispatch()
            assert (report.claimed, report.batches, report.given_back) == (1, 1, 0), turn
            assert report.more_due, "the room was used up: the loop claims again at once"
        assert ScheduledJob.objects.filter(state=JobState.CLAIMED).count() == 6
        pending = ScheduledJob.objects.filter(pk__in=routine, state=JobState.PENDING)
        assert pending.count() == 95
        assert not pending.exclude(updated_at__lt=ScheduledJob.objects.get(pk=urgent.id).claimed_at).exists(), (
            "the rows not taken were never claimed and given back"
        )
    finally:
        client.delete(key)
