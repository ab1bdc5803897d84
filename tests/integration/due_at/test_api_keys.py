"""Keyed scheduling next to a running job, against real PostgreSQL: no waiting, one successor, the chain recipe.

A key names at most one *waiting* job (pending, or claimed and not yet started). A running job's
row is held by its atomic chunk's transaction; ``schedule(key=K)`` must never wait for it (the
session's ``lock_timeout`` turns a wait into an error here, so no test measures time), and a
handler scheduling its own key's next run leaves exactly one successor.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from scheduling import api, exceptions, registry
from scheduling.due_at import lifecycle, runner, store
from scheduling.models import AttemptOutcome, JobState, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600


def _chain(on_conflict: str) -> Callable[[registry.Job], None]:
    def handler(job: registry.Job) -> None:
        """Schedule this entity's next run under the job's own key (twice: a repeat changes nothing)."""
        for _ in range(2):
            api.schedule(
                job.kind,
                {"n": job.payload["n"] + 1},
                key=job.key,
                owner=job.owner_id,
                delay=HOUR,
                on_conflict=on_conflict,
            )
        if job.payload.get("fail_first") and job.attempt == 1:
            raise RuntimeError("first attempt fails after scheduling its successor")

    return handler


registry.handler(
    "test.chain_replace", schema={"type": "object"}, timeout=10, max_attempts=3, backoff=registry.Backoff(0.01, 0.02)
)(_chain("replace"))
registry.handler(
    "test.chain_keep", schema={"type": "object"}, timeout=10, max_attempts=3, backoff=registry.Backoff(0.01, 0.02)
)(_chain("keep"))
registry.handler(
    "test.chain_committing",
    schema={"type": "object"},
    timeout=10,
    max_attempts=3,
    atomic=False,
    backoff=registry.Backoff(0.01, 0.02),
)(_chain("replace"))


def _keyed(key: str, **kwargs: Any) -> list[tuple[int, str, int]]:
    """(id, state, attempts) of every job with ``key``, oldest first."""
    return list(ScheduledJob.objects.filter(key=key, **kwargs).order_by("id").values_list("id", "state", "attempts"))


def _running(run_sql: Callable[..., Any], key: str) -> store.StartedJob:
    """A keyed job claimed and started by a worker: running."""
    job = api.schedule("demo.noop", {"v": 0}, delay=HOUR, key=key)
    support.make_due(job.id)
    (claim,) = store.claim_due_jobs(10)
    (started,) = store.start_jobs([(claim.id, claim.token)], "worker:1")
    return started


def _chunk_holding(raw_connect: Callable[..., Any], started: store.StartedJob, then: str) -> Any:
    """Another connection plays the atomic chunk: it locks the running row (lock_claims) and, with
    ``then``, records the outcome inside its still-open transaction, as the runner does before COMMIT."""
    chunk = raw_connect()
    cursor = chunk.cursor()
    claims = {"ids": [started.id], "tokens": [started.token]}
    cursor.execute(store.SQL["lock_claims"], claims)
    assert cursor.fetchall() == [(started.id,)]
    now = dt.datetime.now(dt.UTC)
    if then == "done":
        done = store.Change(started.id, started.token, lifecycle.Event.SUCCEEDED, started_at=now, finished_at=now)
        cursor.execute(store.SQL["set_job_states"], store.transition_params([done]))
    elif then == "failed":
        failed = store.Change(
            started.id, started.token, lifecycle.Event.FAILED, error="boom", started_at=now, finished_at=now
        )
        cursor.execute(store.SQL["set_job_states"], store.transition_params([failed]))
    return chunk


def _no_waiting(call: Callable[[], Any]) -> Any:
    """Run ``call`` in a transaction whose lock_timeout is tiny: any wait on a row lock raises instead."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '100ms'")
        return call()


@pytest.mark.parametrize("then", ["locked", "done", "failed"])
@pytest.mark.parametrize("on_conflict", ["replace", "keep", "error"])
def test_schedule_by_key_never_waits_on_the_running_jobs_chunk(run_sql, raw_connect, on_conflict, then):
    """While a chunk holds K's running row (locked, or its outcome uncommitted), schedule(key=K) returns a successor."""
    started = _running(run_sql, "acct:1")
    chunk = _chunk_holding(raw_connect, started, then)
    job, outcome = _no_waiting(
        lambda: api.schedule_with_outcome("demo.noop", {"v": 1}, delay=HOUR, key="acct:1", on_conflict=on_conflict)
    )
    assert (outcome, job.state) == ("created", JobState.PENDING)
    assert job.id != started.id, "the running job is never replaced or returned"
    chunk.commit()
    final = {"locked": JobState.RUNNING, "done": JobState.DONE, "failed": JobState.PENDING}[then]
    assert ScheduledJob.objects.get(pk=started.id).state == final
    assert ScheduledJob.objects.get(pk=job.id).payload == {"v": 1}
    again, outcome = api.schedule_with_outcome("demo.noop", {"v": 2}, delay=HOUR, key="acct:1", on_conflict="keep")
    assert (again.id, outcome) == (job.id, "kept"), "the successor is now the key's waiting job"


def test_replace_keep_and_error_act_on_the_waiting_successor(run_sql, raw_connect):
    """Beside a running job, replace moves the waiting successor, keep returns it, error names it."""
    started = _running(run_sql, "acct:2")
    chunk = _chunk_holding(raw_connect, started, "locked")
    first = _no_waiting(lambda: api.schedule("demo.noop", {"v": 1}, delay=HOUR, key="acct:2"))
    moved, outcome = _no_waiting(lambda: api.schedule_with_outcome("demo.noop", {"v": 2}, delay=10, key="acct:2"))
    assert (moved.id, outcome) == (first.id, "replaced")
    kept, outcome = _no_waiting(
        lambda: api.schedule_with_outcome("demo.noop", {"v": 3}, delay=HOUR, key="acct:2", on_conflict="keep")
    )
    assert (kept.id, outcome) == (first.id, "kept")
    with pytest.raises(exceptions.KeyConflict) as refused:
        _no_waiting(lambda: api.schedule("demo.noop", {"v": 4}, delay=HOUR, key="acct:2", on_conflict="error"))
    assert refused.value.job_id == first.id
    chunk.commit()
    assert _keyed("acct:2") == [(started.id, JobState.RUNNING, 1), (first.id, JobState.PENDING, 0)]
    assert ScheduledJob.objects.get(pk=first.id).payload == {"v": 2}


def test_replace_takes_back_a_claim_not_yet_started(run_sql):
    """A claim not yet started is still waiting: replace takes it back, and its queued message runs nothing."""
    job = api.schedule("demo.noop", {"v": 1}, delay=HOUR, key="acct:3")
    support.make_due(job.id)
    (claim,) = store.claim_due_jobs(10)
    moved, outcome = api.schedule_with_outcome("demo.noop", {"v": 2}, delay=HOUR, key="acct:3")
    assert (moved.id, outcome) == (job.id, "replaced")
    row = ScheduledJob.objects.get(pk=job.id)
    assert (row.state, row.attempts, row.token, row.payload) == (JobState.PENDING, 0, None, {"v": 2})
    assert store.start_jobs([(claim.id, claim.token)], "worker:1") == [], "the old claim's message starts nothing"
    assert store.unclaim_jobs([(claim.id, claim.token)]) == []


def test_a_failed_running_job_and_its_waiting_successor_coexist(run_sql):
    """The running job fails back to pending beside a waiting successor: no unique violation; the successor leads."""
    started = _running(run_sql, "acct:4")
    successor = api.schedule("demo.noop", {"v": 1}, delay=HOUR, key="acct:4")
    now = dt.datetime.now(dt.UTC)
    failure = store.Outcome(started.id, started.token, now, now, AttemptOutcome.FAILED, "boom", 0.0)
    assert [m.state for m in store.fail_jobs([failure])] == [JobState.PENDING]
    assert _keyed("acct:4", state=JobState.PENDING) == [(started.id, "pending", 1), (successor.id, "pending", 0)]
    moved = api.schedule("demo.noop", {"v": 2}, delay=HOUR, key="acct:4")
    assert moved.id == successor.id, "replace acts on the waiting successor, not the retry of a started run"
    assert api.cancel(key="acct:4") == successor.id
    again = api.schedule("demo.noop", {"v": 3}, delay=HOUR, key="acct:4")
    assert again.id == started.id, "with no first-attempt job waiting, the pending retry is the key's job"


def test_retrying_two_dead_jobs_of_one_key_retries_the_newest_only(run_sql):
    """retry_dead over two dead jobs of one key: one comes back, the other stays dead, no unique violation."""
    ids = [api.schedule("demo.noop", {}, delay=HOUR, key="acct:5", on_conflict="error").id]
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'dead', finished_at = now(), attempts = max_attempts WHERE id = %s",
        [ids[0]],
    )
    ids.append(api.schedule("demo.noop", {}, delay=HOUR, key="acct:5", on_conflict="error").id)
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'dead', finished_at = now(), attempts = max_attempts WHERE id = %s",
        [ids[1]],
    )
    result = api.retry_dead_many(ids)
    assert result.changed == (ids[1],)
    assert result.untouched == {ids[0]: JobState.DEAD}


@pytest.mark.parametrize("kind", ["test.chain_replace", "test.chain_keep"])
def test_a_handler_schedules_its_own_keys_next_run(run_sql, kind):
    """The chain recipe through the real runner: the job ends done, leaving exactly one successor due a delay later."""
    owner_key = f"chain:{kind}"
    first = api.schedule(kind, {"n": 0}, delay=HOUR, key=owner_key)
    support.make_due(first.id)
    (claim,) = store.claim_due_jobs(10)
    report = runner.run_batch([(claim.id, claim.token)])
    assert (report.succeeded, report.failed) == (1, 0)
    rows = _keyed(owner_key)
    assert [(r[1], r[2]) for r in rows] == [(JobState.DONE, 1), (JobState.PENDING, 0)], rows
    successor = ScheduledJob.objects.get(pk=rows[1][0])
    assert successor.payload == {"n": 1}
    (ahead,) = run_sql(
        "SELECT extract(epoch FROM due_at - now()) FROM scheduling_scheduledjob WHERE id = %s", [successor.id]
    )[0]
    assert HOUR - 60 < ahead <= HOUR


@pytest.mark.parametrize("kind", ["test.chain_replace", "test.chain_committing"])
def test_a_chain_whose_first_attempt_fails_still_leaves_one_successor(run_sql, kind):
    """Atomic: a failed attempt's successor rolls back; committing: it stays, the retry moves it. One successor."""
    owner_key = f"chain-fail:{kind}"
    first = api.schedule(kind, {"n": 0, "fail_first": True}, delay=HOUR, key=owner_key)
    for _ in range(2):
        support.make_due(first.id)
        (claim,) = store.claim_due_jobs(10)
        runner.run_batch([(claim.id, claim.token)])
    assert ScheduledJob.objects.get(pk=first.id).state == JobState.DONE
    waiting = _keyed(owner_key, state=JobState.PENDING)
    assert len(waiting) == 1, waiting
    assert ScheduledJob.objects.get(pk=waiting[0][0]).payload == {"n": 1}
