"""Broker blips under a running worker: Redis (append-only, as in production) restarted while work is held.

A real ``celery worker`` on a private PostgreSQL and a private append-only Redis
(``private_services``); Redis is restarted (SIGTERM, down 2 s, started again on its file) while
batches are running and countdowns are held, the worker is never stopped or frozen. What these
tests prove lives in ``scheduling.core.broker`` (``Reconnect``, the worker's consumer step): the
worker stays up, a message finished during the outage is acknowledged on the new connection, and
the countdowns it held come back at once instead of after the visibility timeout.
"""

from __future__ import annotations

import json
import time

import pytest

from scheduling.core import locks
from tests.e2e import private_services
from tests.e2e.harness import wait_for, wait_ready
from tests.e2e.private_services import Stack, record_result

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pg_template = private_services.pg_template  # fixtures: a private PostgreSQL and Redis per test
private_stack = private_services.private_stack
REDIS_APPENDONLY = True  # the private Redis keeps its data across a restart, as a production one does

DOWN_SECONDS = 2.0
RESTARTS = 3
# The bound a countdown may be late by after a blip, beyond its normal lag (docs/fault-tolerance.md):
# the worker reconnects (kombu retries at once, then every 2 s) and restores what it held.
BLIP_LATENESS_BOUND_SECONDS = 30.0


def _executions(stack: Stack, prefix: str) -> dict[str, int]:
    rows = stack.sql(
        "SELECT idempotency_key, count(*) FROM tasks_execution WHERE idempotency_key LIKE %s GROUP BY 1", [prefix + "%"]
    )
    return dict(rows)


def _running_batch(stack: Stack, ids: list[int]) -> bool:
    """Some of ``ids`` are done and some started and not done: a batch is in the middle of its work."""
    done, started = stack.sql(
        "SELECT count(*) FILTER (WHERE state = 'done'),"
        " count(*) FILTER (WHERE state = 'running')"
        " FROM scheduling_scheduledjob WHERE id = ANY(%s)",
        [ids],
    )[0]
    return done > 0 and started > 0


def _leader_sessions(stack: Stack) -> int:
    """Sessions holding the control loop's leader lock (an advisory lock on one 64-bit key)."""
    key = locks.lock_key("control", "leader")
    return int(
        stack.value(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND ((classid::bigint << 32) | objid::bigint) = (%s::bigint & x'ffffffffffffffff'::bigint)",
            [key],
        )
    )


def test_worker_survives_redis_restarts_while_batches_complete(private_stack: Stack) -> None:
    """Redis restarted 3 times while batches finish: the worker stays up, keeps the lead, every job done once."""
    stack = private_stack
    stack.cluster.env.update({"SCHEDULING_SWEEP_INTERVAL_SECONDS": "2"})
    worker = stack.cluster.worker("w1", concurrency=2)
    wait_ready(worker)
    ids: list[int] = []
    for restart in range(RESTARTS):
        # 20 jobs of 0.4 s in one batch (chunks of at most 0.5 s commit as it goes): it runs for 8 s,
        # so batches finish (and ask for their acknowledgement) while Redis is away.
        wave = [
            stack.schedule("demo.record", {"label": f"r{restart}", "sleep": 0.4}, lease_seconds=30) for _ in range(20)
        ]
        ids += wave
        wait_for(lambda wave=wave: _running_batch(stack, wave), 60, 0.05, message="a batch to be mid-run")
        stack.redis.restart(DOWN_SECONDS, graceful=True)
        wait_for(
            lambda wave=wave: (
                stack.value(
                    "SELECT count(*) FROM scheduling_scheduledjob WHERE id = ANY(%s) AND state = 'done'", [wave]
                )
                == len(wave)
            ),
            120,
            message=f"wave {restart} done",
        )
        assert worker.popen.poll() is None, f"the worker exited after restart {restart + 1}:\n{worker.log()[-3000:]}"
    # Claimed after the last restart: only a leading control loop claims.
    last = [stack.schedule("demo.record", {"label": "after"}, lease_seconds=30) for _ in range(10)]
    ids += last
    wait_for(
        lambda: (
            stack.value("SELECT count(*) FROM scheduling_scheduledjob WHERE id = ANY(%s) AND state = 'done'", [last])
            == len(last)
        ),
        60,
        message="the jobs scheduled after the restarts",
    )

    log = worker.log()
    assert worker.popen.poll() is None, "the worker process carried on (the one started above)"
    assert "Unrecoverable error" not in log
    assert "worker_cancel_long_running_tasks_on_connection_loss" not in log, "the setting is decided, not warned about"
    assert _leader_sessions(stack) == 1, "the worker's control loop leads"
    assert stack.states() == {"done": len(ids)}
    succeeded = dict(
        stack.sql("SELECT job_id, count(*) FROM scheduling_jobattempt WHERE outcome = 'succeeded' GROUP BY job_id")
    )
    assert succeeded == dict.fromkeys(ids, 1), "every job ended done exactly once"
    assert _executions(stack, "job:") == {f"job:{i}": 1 for i in ids}, "an atomic job's effect committed once"
    late_acks = log.count("acknowledged on the new connection")
    assert late_acks >= 1, "a batch finished during an outage and its message was acknowledged after reconnecting"
    record_result(
        "broker_restart_batches_completing",
        {"restarts": RESTARTS, "down_seconds": DOWN_SECONDS, "jobs": len(ids), "late_acks": late_acks},
    )


DEFER_SCRIPT = """
import json
from scheduling import api
print(json.dumps([[d.id, d.due_at.timestamp()] for d in
                  (api.defer("demo.record", {{"label": "d"}}, {first} + i * {step}) for i in range({count}))]))
"""


def test_held_countdowns_come_back_promptly_after_a_redis_restart(private_stack: Stack) -> None:
    """Countdowns held across a 2 s Redis restart run once each, none later than the stated bound (timeout 3600 s)."""
    stack = private_stack
    worker = stack.cluster.worker("w1", concurrency=2)  # CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS: 3600 (default)
    wait_ready(worker)
    count = 40
    # Due 12-22 s ahead: the restart (a few seconds after the last defer) comes before the first is due.
    out = stack.manage("shell", "-c", DEFER_SCRIPT.format(count=count, first=12.0, step=0.25))
    deferrals = {d: due for d, due in json.loads(out.strip().splitlines()[-1])}
    client = stack.redis.client()
    prefix = stack.cluster.env.get("CELERY_BROKER_KEYPREFIX", "")
    wait_for(lambda: client.hlen(f"{prefix}unacked") == count, 30, message="the worker to hold every countdown")
    stack.redis.restart(DOWN_SECONDS, graceful=True)
    back_at = time.time()
    last_due = max(deferrals.values())
    wait_for(
        lambda: len(_executions(stack, "broker:")) == count or time.time() > last_due + 2 * BLIP_LATENESS_BOUND_SECONDS,
        last_due - time.time() + 2 * BLIP_LATENESS_BOUND_SECONDS + 5,
        0.5,
        message="every countdown to run",
    )
    time.sleep(3)  # a duplicate would show here
    per_key = _executions(stack, "broker:")
    started = dict(
        stack.sql(
            "SELECT idempotency_key, extract(epoch FROM min(started_at)) FROM tasks_execution"
            " WHERE idempotency_key LIKE 'broker:%%' GROUP BY 1"
        )
    )
    lateness = {d: float(started[f"broker:{d}"]) - due for d, due in deferrals.items() if f"broker:{d}" in started}
    duplicates = sum(n - 1 for n in per_key.values())
    restored = worker.log().count("countdowns put back")

    assert worker.popen.poll() is None, worker.log()[-3000:]
    assert set(per_key) == {f"broker:{d}" for d in deferrals}, "no countdown lost"
    assert max(lateness.values()) <= BLIP_LATENESS_BOUND_SECONDS, f"latest: {max(lateness.values()):.1f}s late"
    assert duplicates == 0, f"{duplicates} countdowns ran twice"
    assert restored >= 1, "the worker put its held countdowns back after reconnecting"
    record_result(
        "broker_restart_countdowns_held",
        {
            "countdowns": count,
            "down_seconds": DOWN_SECONDS,
            "restarted_at_before_first_due_seconds": round(min(deferrals.values()) - back_at, 1),
            "max_late_seconds": round(max(lateness.values()), 3),
            "duplicates": duplicates,
        },
    )
