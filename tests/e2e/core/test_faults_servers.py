"""Server faults against private PostgreSQL and Redis: restarts and outages under a running cluster.

Each test starts its own PostgreSQL and Redis (``private_services``), a real beat and real
workers pointed at them, injects the fault on those servers only, and then checks the rows: the
database is the truth. Recovery times are printed and written to tests/artifacts/faults-servers.json.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import signal
import time
from typing import Any

import pytest
from celery import Celery
from django.conf import settings

from scheduling.due_at import store
from tests.e2e import private_services
from tests.e2e.harness import wait_for, wait_ready
from tests.e2e.private_services import Stack, record_result

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pg_template = private_services.pg_template  # fixtures: a private PostgreSQL and Redis per test
private_stack = private_services.private_stack

FAST_SWEEP = {"SCHEDULING_SWEEP_INTERVAL_SECONDS": "2"}


def _wait_all_final(stack: Stack, timeout: float) -> dict[str, int]:
    def settled() -> dict[str, int] | None:
        try:
            states = stack.states()
        except Exception:  # the server may still be coming back; keep polling
            return None
        return states if set(states) <= {"done", "dead", "cancelled"} else None

    return wait_for(settled, timeout, 0.25, message="every job to reach a final state")


def _first_completion_after(stack: Stack, wall: float) -> float | None:
    """Seconds from ``wall`` (epoch) to the first job finished after it, by the database's clock."""
    got = stack.value(
        "SELECT extract(epoch FROM min(finished_at)) FROM scheduling_scheduledjob"
        " WHERE state = 'done' AND finished_at > to_timestamp(%s)",
        [wall],
    )
    return None if got is None else float(got) - wall


def _backlog_done_after(stack: Stack, wall: float) -> float:
    """Seconds from ``wall`` until the last job that was already due at ``wall`` finished."""
    got = stack.value(
        "SELECT extract(epoch FROM max(finished_at)) FROM scheduling_scheduledjob WHERE due_at <= to_timestamp(%s)",
        [wall],
    )
    return float(got) - wall


def _unexplained_reruns(stack: Stack) -> list[tuple[Any, ...]]:
    """Jobs that ran more than once without a recorded failed or reclaimed attempt to explain it."""
    return stack.sql(
        """
        SELECT j.id, e.n
        FROM scheduling_scheduledjob AS j
        JOIN (SELECT idempotency_key, count(*) AS n FROM tasks_execution GROUP BY idempotency_key) AS e
          ON e.idempotency_key = 'job:' || j.id
        WHERE e.n > 1 + (SELECT count(*) FROM scheduling_jobattempt AS a
                         WHERE a.job_id = j.id AND a.outcome <> 'succeeded')
        """
    )


def test_postgres_restart_during_claims_and_completions(private_stack: Stack) -> None:
    """pg_ctl restart -m immediate mid-stream: nothing committed lost, processes reconnect, nothing stranded."""
    stack = private_stack
    stack.cluster.env.update(FAST_SWEEP)
    workers = [stack.cluster.worker("w1", concurrency=2), stack.cluster.worker("w2", concurrency=2)]
    beat = stack.cluster.beat()
    for w in workers:
        wait_ready(w)
    total = 360
    ids = [
        stack.schedule(
            "demo.record", {"label": f"r{i}", "sleep": 0.1}, delay=2 + i * 0.05, lease_seconds=8, max_attempts=5
        )
        for i in range(total)
    ]  # due over ~18 s, so claims and completions are going on when the server restarts
    cancelled = [stack.schedule("demo.record", {}, delay=5, lease_seconds=8) for _ in range(20)]
    for job_id in cancelled:  # cancel() commits synchronously: a crash must never bring these back
        assert stack.sql(store.SQL["cancel_job"], {"id": job_id})

    wait_for(lambda: stack.states().get("done", 0) >= total // 4, 60, message="a quarter of the jobs done")
    committed_before = dict(stack.sql("SELECT id, finished_at FROM scheduling_scheduledjob WHERE state = 'done'"))
    executions_before = stack.executions_per_key()
    fault_at = time.time()
    stack.pg.restart(mode="immediate")
    back_at = time.time()

    states = _wait_all_final(stack, 90)
    first_after = wait_for(lambda: _first_completion_after(stack, back_at), 30, message="a job done after the restart")
    due_by_then_done_after = _backlog_done_after(stack, back_at)

    assert states == {"done": total, "cancelled": len(cancelled)}, states
    # Nothing committed before the restart was lost: every job scheduled, every cancellation ...
    assert not any(f"job:{i}" in stack.executions_per_key() for i in cancelled)
    still = dict(
        stack.sql("SELECT id, finished_at FROM scheduling_scheduledjob WHERE id = ANY(%s)", [list(committed_before)])
    )
    undone = sorted(i for i, finished in committed_before.items() if still[i] != finished)
    # ... and every completion: outcomes always commit synchronously (only claims and starts may be
    # asynchronous, SCHEDULING_ASYNC_COMMIT; a lost claim just means that job is claimed again).
    assert undone == [], "completions committed before the restart were lost"
    after = stack.executions_per_key()
    assert all(after.get(k, 0) >= n for k, n in executions_before.items())
    # Every job ran, finished with exactly one succeeded attempt; any rerun is explained by an attempt row.
    assert set(after) == {f"job:{i}" for i in ids}
    succeeded = dict(
        stack.sql("SELECT job_id, count(*) FROM scheduling_jobattempt WHERE outcome = 'succeeded' GROUP BY job_id")
    )
    assert succeeded == dict.fromkeys(ids, 1)
    assert [row for row in _unexplained_reruns(stack) if row[0] not in undone] == []
    # The same processes carried on: they reconnected by themselves.
    assert all(p.popen.poll() is None for p in [*workers, beat])
    assert (
        stack.value(
            "SELECT count(*) FROM scheduling_schedulerheartbeat"
            " WHERE role = 'beat' AND heartbeat_at > to_timestamp(%s)",  # the control loop writes a row too
            [back_at],
        )
        == 1
    ), "beat wrote its heartbeat after the restart"
    reruns = sum(n - 1 for n in after.values())
    record_result(
        "fault_3_postgres_restart",
        {
            "jobs": total,
            "restart_seconds": round(back_at - fault_at, 3),
            "recovery_first_job_done_seconds": round(first_after, 3),
            "recovery_backlog_done_seconds": round(due_by_then_done_after, 3),
            "reruns_explained_by_attempt_rows": reruns,
            "completions_undone_by_the_crash": len(undone),
        },
    )


def _log_lines_between(text: str, needle: str, start: float, end: float) -> list[float]:
    """Epoch times of log lines containing ``needle`` stamped between ``start`` and ``end`` (local time)."""
    stamps = []
    for line in text.splitlines():
        if needle in line and line.startswith("[") and len(line) > 24:
            with contextlib.suppress(ValueError):
                at = time.mktime(time.strptime(line[1:20], "%Y-%m-%d %H:%M:%S")) + int(line[21:24]) / 1000
                if start <= at <= end:
                    stamps.append(at)
    return stamps


def test_postgres_unreachable_for_30s(private_stack: Stack) -> None:
    """PostgreSQL stopped for 30 s: processes fail closed without hanging, nothing runs twice, backlog drains."""
    stack = private_stack
    stack.cluster.env.update(FAST_SWEEP)
    workers = [stack.cluster.worker("w1", concurrency=2), stack.cluster.worker("w2", concurrency=2)]
    beat = stack.cluster.beat()
    for w in workers:
        wait_ready(w)
    lease = 45  # longer than the outage plus a heartbeat interval: live claims survive it
    before = [stack.schedule("demo.record", {}, delay=1 + i * 0.05, lease_seconds=lease) for i in range(40)]
    # A kind that commits as it goes: its outcome is a statement of its own, retried through the outage.
    sleepers = [stack.schedule("demo.record_committing", {"sleep": 6}, delay=3, lease_seconds=lease)]
    wait_for(lambda: stack.executions_per_key().get(f"job:{sleepers[0]}"), 60, message="the sleeper to start")
    during = [stack.schedule("demo.record", {}, delay=2 + i * 0.4, lease_seconds=lease) for i in range(60)]
    after = [stack.schedule("demo.record", {}, delay=40 + i * 0.1, lease_seconds=lease) for i in range(30)]
    ids = before + sleepers + during + after

    down_at = time.time()
    stack.pg.stop("fast")  # the sleeper is mid-run: its outcome must wait for the database
    stopped_at = time.time()
    time.sleep(max(0.0, 30 - (stopped_at - down_at)))
    assert all(p.popen.poll() is None for p in [*workers, beat]), "no process died while the database was down"
    stack.pg.start()
    back_at = time.time()

    states = _wait_all_final(stack, 90)
    first_after = wait_for(lambda: _first_completion_after(stack, back_at), 30, message="a job done after the outage")
    backlog_after = _backlog_done_after(stack, back_at)

    assert states == {"done": len(ids)}, states
    per_key = stack.executions_per_key()
    assert per_key == {f"job:{i}": 1 for i in ids}, "every job ran exactly once"
    attempts = dict(stack.sql("SELECT outcome, count(*) FROM scheduling_jobattempt GROUP BY outcome"))
    slept = stack.value(
        "SELECT extract(epoch FROM finished_at - started_at) FROM scheduling_jobattempt WHERE job_id = %s",
        [sleepers[0]],
    )
    assert slept >= 6, "the sleeper got its payload, ran through the outage and recorded one outcome"
    # Fail closed: nothing started while the database was away.
    started_in_outage = stack.value(
        "SELECT count(*) FROM scheduling_jobattempt"
        " WHERE started_at > to_timestamp(%s) AND started_at < to_timestamp(%s)",
        [stopped_at + 0.5, back_at - 0.5],
    )
    assert started_in_outage == 0
    # Bounded waits: beat kept looping (standing by, sending nothing) instead of hanging in a connect.
    beat_tries = _log_lines_between(beat.log(), "cannot reach PostgreSQL", stopped_at, back_at)
    assert len(beat_tries) >= 10, f"beat retried {len(beat_tries)} times in 30 s"
    gaps = [b - a for a, b in zip([stopped_at, *beat_tries], [*beat_tries, back_at], strict=True)]
    assert max(gaps) < 10, f"beat went {max(gaps):.1f}s without a try"
    # ... and the worker that finished the sleeper kept retrying its outcome (bounded backoff), not hanging.
    record_tries = sorted(
        t for w in workers for t in _log_lines_between(w.log(), "cannot record outcomes", stopped_at, back_at)
    )
    assert len(record_tries) >= 5, f"the outcome was retried {len(record_tries)} times"
    assert max(b - a for a, b in itertools.pairwise(record_tries)) < 5
    assert all(p.popen.poll() is None for p in [*workers, beat])
    record_result(
        "fault_8_postgres_unreachable_30s",
        {
            "jobs": len(ids),
            "outage_seconds": round(back_at - stopped_at, 3),
            "beat_retries_during_outage": len(beat_tries),
            "beat_longest_wait_seconds": round(max(gaps), 3),
            "worker_outcome_retries_during_outage": len(record_tries),
            "attempt_outcomes": attempts,
            "recovery_first_job_done_seconds": round(first_after, 3),
            "recovery_backlog_done_seconds": round(backlog_after, 3),
        },
    )


DEFER_SCRIPT = """
import json
from scheduling import api
print(json.dumps([api.defer("demo.record", {{"label": "d"}}, {first} + i * {step}).id for i in range({count})]))
"""


def _defer(stack: Stack, count: int, first: float, step: float) -> list[str]:
    """Send ``count`` broker deferrals through ``api.defer()`` in a fresh process; their ids."""
    out = stack.manage("shell", "-c", DEFER_SCRIPT.format(count=count, first=first, step=step))
    return json.loads(out.strip().splitlines()[-1])


def _broker_messages(stack: Stack, task: str) -> int:
    """Messages for ``task`` on the private Redis: waiting in a queue list or held unacknowledged by a worker."""
    client = stack.redis.client()
    prefix = stack.cluster.env.get("CELERY_BROKER_KEYPREFIX", "")
    found = 0
    for queue in ["celery", "timekeeper.deferred"]:
        found += sum(
            1 for raw in client.lrange(f"{prefix}{queue}", 0, -1) if json.loads(raw)["headers"]["task"] == task
        )
    for raw in client.hvals(f"{prefix}unacked"):
        found += json.loads(raw)[0]["headers"]["task"] == task
    client.close()
    return found


def _send_run_batches(stack: Stack, claims: list[list[Any]], size: int = 20) -> None:
    """Send run_batch messages for ``claims`` to the private Redis, as the claim does (same key prefix).

    The URL goes to the connection itself: Celery prefers $CELERY_BROKER_URL (the shared test
    Redis, in this process) over any configured one.
    """
    sender = Celery("timekeeper-test-sender", backend="disabled://", set_as_current=False)
    sender.conf.broker_transport_options = dict(settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    sender.conf.task_serializer = "json"
    with sender.connection_for_write(stack.redis.url()) as conn:
        for i in range(0, len(claims), size):
            sender.send_task("scheduling.run_batch", args=[claims[i : i + size]], connection=conn)
    sender.close()


def _claim_with_lost_messages(stack: Stack, count: int, lease: int) -> list[list[Any]]:
    """Insert ``count`` due jobs and claim them in one transaction (no worker can take them first); their claims."""
    conn = stack.pg.connect(autocommit=False)
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)  # due before anything else: claimed first
    params = {"kind": "demo.record", "payload": "{}", "due_at": an_hour_ago, "delay": 0.0, "lease_seconds": lease,
              "max_attempts": 5, "key": None, "owner_id": None, "priority": 0}  # fmt: skip
    params.update(store.NO_OVERRIDES.params())  # the kind's timeout, backoff and atomicity
    params.update(unique_key=None, unique_states=None)  # no uniqueness window
    with conn, conn.cursor() as cur:
        inserted = set()
        for _ in range(count):
            cur.execute(store.SQL["insert_job"], params)
            inserted.add(cur.fetchone()[0])
        cur.execute(store.SQL["claim_due_jobs"], store.claim_params(count))
        claims = [[row[0], row[1]] for row in cur.fetchall()]
    conn.close()
    assert {c[0] for c in claims} == inserted
    return claims


def test_redis_restart_without_persistence(private_stack: Stack) -> None:
    """Redis killed and restarted empty: every due_at job still runs; lost countdowns are counted exactly."""
    stack = private_stack
    stack.cluster.env.update(FAST_SWEEP)
    worker = stack.cluster.worker("w1", concurrency=2)
    beat = stack.cluster.beat()
    wait_ready(worker)
    lease = 6  # a claim whose run_batch message vanished with Redis is swept back after this
    due = [stack.schedule("demo.record", {}, delay=0, lease_seconds=lease) for _ in range(40)]  # rows: safe
    later = [stack.schedule("demo.record", {}, delay=15 + i * 0.1, lease_seconds=lease) for i in range(40)]
    deferred_before = _defer(stack, 30, 25.0, 0.2)  # countdowns due well after the restart
    wait_for(lambda: _broker_messages(stack, "scheduling.run_deferred") == 30, 30, message="the worker to hold them")
    # Freeze the worker's consumer so run_batch messages wait in Redis, then claim 60 due jobs and
    # send their run_batch messages: claims whose only trace outside the table dies with Redis.
    worker.signal(signal.SIGSTOP)
    try:
        claims = _claim_with_lost_messages(stack, 60, lease)
        _send_run_batches(stack, claims)
        batches_at_risk = _broker_messages(stack, "scheduling.run_batch")
        countdowns_at_risk = _broker_messages(stack, "scheduling.run_deferred")
        fault_at = time.time()
        stack.redis.restart()  # SIGKILL, then an empty server on the same port: nothing persisted
        back_at = time.time()
    finally:
        worker.signal(signal.SIGCONT)
    deferred_after = _defer(stack, 10, 2.0, 0.1)  # the broker works again for new countdowns

    ids = due + [c[0] for c in claims] + later
    states = _wait_all_final(stack, 90)
    wait_for(
        lambda: all(stack.executions_per_key().get(f"broker:{d}") for d in deferred_after),
        60,
        message="the deferrals sent after the restart",
    )
    time.sleep(max(0.0, fault_at + 25 + 30 * 0.2 + 5 - time.time()))  # past every lost countdown's due time

    assert states == {"done": len(ids)}, states
    per_key = stack.executions_per_key()
    assert {k: v for k, v in per_key.items() if k.startswith("job:")} == {f"job:{i}": 1 for i in ids}
    swept = stack.value("SELECT count(DISTINCT job_id) FROM scheduling_jobattempt WHERE outcome = 'reclaimed'")
    # A frozen consumer's pending BRPOP may already have popped one message off the list: 2 or 3 wait there.
    assert batches_at_risk >= 2
    assert 20 * batches_at_risk <= swept <= 60, "the claims whose run_batch message died with Redis were swept back"
    assert all(per_key.get(f"broker:{d}") == 1 for d in deferred_after)
    ran_before = sum(per_key.get(f"broker:{d}", 0) for d in deferred_before)
    assert all(per_key.get(f"broker:{d}", 0) <= 1 for d in deferred_before), "no countdown ran twice"
    lost = len(deferred_before) - ran_before
    assert countdowns_at_risk == len(deferred_before), "every countdown was on the broker at the restart"
    assert lost == countdowns_at_risk, "exactly the countdowns Redis held were lost, no more, no fewer"
    assert all(p.popen.poll() is None for p in [worker, beat]), "the worker and beat reconnected by themselves"
    first_after = _first_completion_after(stack, back_at)
    swept_done = stack.value(
        "SELECT extract(epoch FROM max(finished_at)) FROM scheduling_scheduledjob WHERE id = ANY(%s)",
        [[c[0] for c in claims]],
    )
    first_deferral = stack.value(
        "SELECT extract(epoch FROM min(started_at)) FROM tasks_execution WHERE idempotency_key = ANY(%s)",
        [[f"broker:{d}" for d in deferred_after]],
    )
    record_result(
        "fault_4_redis_restart",
        {
            "due_at_jobs": len(ids),
            "due_at_jobs_run_once": len(ids),
            "run_batch_messages_lost": batches_at_risk,
            "claims_swept_back": swept,
            "countdowns_sent_before_restart": len(deferred_before),
            "countdowns_lost_with_redis": lost,
            "countdowns_sent_after_restart_run": len(deferred_after),
            "recovery_first_job_done_seconds": round(first_after or -1, 3),
            "recovery_lost_claims_done_seconds": round(float(swept_done) - back_at, 3),
            "first_new_deferral_ran_after_restart_seconds": round(float(first_deferral) - back_at, 3),
        },
    )
