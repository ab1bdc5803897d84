"""The worker's start-time checks: a worker under a pool that cannot keep timeouts and leases does not start."""

from __future__ import annotations

import pytest

from tests.e2e.harness import wait_for

pytestmark = [pytest.mark.e2e]


def test_a_worker_refuses_to_start_under_the_threads_pool(cluster):
    """A worker started with --pool threads exits at start with scheduling.E011, naming the pool and the fix."""
    worker = cluster.worker(pool="threads")
    wait_for(lambda: not worker.alive() or "ready." in worker.log(), 60, message="the worker to exit or start")
    log = worker.log()
    assert "ready." not in log
    assert worker.popen.wait(30) != 0
    assert "scheduling.E011" in log
    assert "the worker pool 'threads' is not supported" in log
    assert "--pool prefork" in log
