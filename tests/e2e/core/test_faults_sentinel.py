"""A Redis failover under Sentinel is a blip: a worker and beat on a ``sentinel://`` broker carry on.

A private primary, a replica and one sentinel (quorum 1) on loopback ports; a real worker (its
control loop leads) whose broker URL names the sentinel. The primary is killed (SIGKILL, no
persistence); the sentinel promotes the replica. Due jobs claimed after the failover run, and a
deferral sent after it runs. What a failover may lose is measured, not asserted: countdowns that
the primary acknowledged in the instant before it died, before its replica had them (Redis
replicates asynchronously). The figures go to tests/artifacts/faults-servers.json.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from tests import support
from tests.e2e import harness, private_services
from tests.e2e.harness import wait_for, wait_ready
from tests.e2e.sentinel import Sentinels

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

pg_template = private_services.pg_template  # the fixtures, made visible to this module's tests
private_stack = private_services.private_stack

BURST = 200  # countdowns sent in the instant before the primary dies


@pytest.fixture
def sentinels(private_stack: private_services.Stack) -> Iterator[Sentinels]:
    """A primary, a replica and a sentinel watching them (stopped after the test)."""
    group = Sentinels(private_stack.pg.base.parent / "sentinels")
    try:
        group.start()
        yield group
    finally:
        group.stop(private_stack.cluster.log_dir)


def _defer(stack: private_services.Stack, env: dict[str, str], count: int, delay: float, tag: str) -> None:
    """``api.defer`` ``count`` demo.record countdowns of ``delay`` s from a process on the sentinel broker."""
    code = (
        "from scheduling import api\n"
        f"for i in range({count}): api.defer('demo.record', {{'note': '{tag}'}}, delay={delay})\n"
    )
    done = support.manage("shell", "-c", code, env=harness.base_env({**stack.cluster.env, **env}), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def _deferred_runs(stack: private_services.Stack) -> int:
    """Deferrals that ran (one Execution per distinct deferral: a redelivered one counts once)."""
    sql = "SELECT count(DISTINCT idempotency_key) FROM tasks_execution WHERE idempotency_key LIKE 'broker:%%'"
    return int(stack.value(sql))


@pytest.mark.parametrize("replica_lagging", [False, True], ids=["replica-in-sync", "replica-lagging"])
def test_a_worker_on_sentinel_carries_on_through_a_failover(private_stack, sentinels, replica_lagging):
    """The primary killed and its replica promoted: jobs due after the failover run, beat's ticks after it
    run, a deferral sent after it runs; the countdowns sent in the instant before the kill are counted
    (what a failover may lose).
    ``replica-lagging``: the replica is stopped (SIGSTOP) while they are sent, so it never had them."""
    stack = private_stack
    env = sentinels.env()
    stack.manage(
        "shell",
        "-c",
        "from scheduling import schedules; "
        "schedules.sync(declarations=[schedules.make(name='sentinel-every-2s', kind='demo.record', every=2)])",
    )
    worker = stack.cluster.worker("w1", concurrency=2, env=env)
    stack.cluster.beat("beat1", env=env)
    wait_ready(worker)
    first = stack.schedule("demo.record", {})
    wait_for(lambda: stack.states().get("done") == 1, 60, message=f"job {first} to run before the failover")

    if replica_lagging:
        sentinels.procs["replica"].send_signal(signal.SIGSTOP)
    _defer(stack, env, BURST, 15, "before")  # acknowledged by the primary; replicated, or not, when it dies
    sent_at = time.monotonic()
    old = sentinels.primary_port
    sentinels.kill("primary")
    if replica_lagging:
        sentinels.procs["replica"].send_signal(signal.SIGCONT)
    killed_at = time.monotonic()
    wait_for(lambda: sentinels.primary() == sentinels.replica_port, 60, message="the sentinel to promote the replica")
    promoted_after = round(time.monotonic() - killed_at, 1)
    assert sentinels.primary() != old

    promoted_at = stack.value("SELECT now()")
    after = [stack.schedule("demo.record", {}) for _ in range(5)]
    wait_for(lambda: stack.states().get("done") == 6, 90, message=f"jobs {after} to run after the failover")
    before_failover = _deferred_runs(stack)
    _defer(stack, env, 1, 1, "after")
    wait_for(lambda: _deferred_runs(stack) >= before_failover + 1, 60, message="the deferral sent after the failover")
    wait_for(
        lambda: (
            stack.value(
                "SELECT count(*) FROM scheduling_schedulerun WHERE state = 'succeeded' AND tick > %s", [promoted_at]
            )
            >= 2
        ),
        60,
        message="beat's ticks after the failover to run",
    )
    # Whatever the primary had not replicated is gone: wait out the countdowns (due 15 s after they were
    # sent) and a margin for the worker to run them, then count; a loss is measured, not refused.
    time.sleep(max(0.0, sent_at + 15 + 20 - time.monotonic()))
    ran = _deferred_runs(stack) - 1
    private_services.record_result(
        f"sentinel_failover_{'replica_lagging' if replica_lagging else 'replica_in_sync'}",
        {
            "promoted_after_seconds": promoted_after,
            "countdowns_sent_just_before_the_kill": BURST,
            "countdowns_that_ran": ran,
            "countdowns_lost": BURST - ran,
        },
    )
    assert stack.states() == {"done": 6}
    duplicates = stack.value("SELECT count(*) - count(DISTINCT (schedule_id, tick)) FROM scheduling_schedulerun")
    assert duplicates == 0, "one run per tick"
