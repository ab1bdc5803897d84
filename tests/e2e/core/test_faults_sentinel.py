"""A Redis failover under Sentinel is a blip: a worker and beat on a ``sentinel://`` broker carry on.

A private primary, a replica and one sentinel (quorum 1) on loopback ports; a real worker (its
control loop leads) whose broker URL names the sentinel. The primary is killed (SIGKILL, no
persistence); the sentinel promotes the replica. Due jobs claimed after the failover run, and a
deferral sent after it runs. What a failover may lose is measured, not asserted: countdowns that
the primary acknowledged in the instant before it died, before its replica had them (Redis
replicates asynchronously). The figures go to tests/artifacts/faults-servers.json.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests import support
from tests.e2e import harness, private_services
from tests.e2e.harness import wait_for, wait_ready
from tests.system_packages import ensure

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

pg_template = private_services.pg_template  # the fixtures, made visible to this module's tests
private_stack = private_services.private_stack

MASTER = "tkmaster"
BURST = 200  # countdowns sent in the instant before the primary dies


class Sentinels:
    """A primary, a replica and one sentinel, each a ``redis-server`` process of this test."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.primary_port = private_services.free_port()
        self.replica_port = private_services.free_port()
        self.sentinel_port = private_services.free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _server(self, name: str, *argv: str) -> None:
        folder = self.base / name
        folder.mkdir(parents=True, exist_ok=True)
        server = shutil.which("redis-server") or "redis-server"
        log = str(folder / "redis.log")
        self.procs[name] = subprocess.Popen(
            [server, *argv, "--dir", str(folder), "--logfile", log], start_new_session=True, stdout=subprocess.DEVNULL
        )

    def start(self) -> None:
        ensure("redis-sentinel", "/usr/bin/redis-sentinel")
        plain = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self._server("primary", "--port", str(self.primary_port), *plain)
        replica_of = ["--replicaof", "127.0.0.1", str(self.primary_port)]
        self._server("replica", "--port", str(self.replica_port), *plain, *replica_of)
        conf = self.base / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.base}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            f"sentinel failover-timeout {MASTER} 5000\n"
        )
        sentinel = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
        self.procs["sentinel"] = subprocess.Popen(
            [sentinel, str(conf), "--logfile", str(self.base / "sentinel.log")],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )
        wait_for(lambda: self._replicated(), 30, message="the replica to be in sync")
        wait_for(lambda: self._sentinel_sees_replica(), 30, message="the sentinel to know the replica")

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)

    def _replicated(self) -> bool:
        try:
            return self.client(self.replica_port).info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False

    def _sentinel_sees_replica(self) -> bool:
        try:
            return bool(self.client(self.sentinel_port).execute_command("SENTINEL", "REPLICAS", MASTER))
        except redis.RedisError:
            return False

    def primary(self) -> int | None:
        """The port of the primary the sentinel names now."""
        try:
            _, port = self.client(self.sentinel_port).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        except (redis.RedisError, TypeError, ValueError):
            return None
        return int(port)

    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.sentinel_port}/0"

    def kill(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self, log_dir: Path) -> None:
        for name in list(self.procs):
            self.kill(name)
        for log in self.base.rglob("*.log"):
            shutil.copyfile(log, log_dir / f"redis-{log.parent.name}-{log.name}")


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
    env = {"CELERY_BROKER_URL": sentinels.url(), "CELERY_BROKER_MASTER_NAME": MASTER}
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
        lambda: stack.value(
            "SELECT count(*) FROM scheduling_schedulerun WHERE state = 'succeeded' AND tick > %s", [promoted_at]
        )
        >= 2,
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
