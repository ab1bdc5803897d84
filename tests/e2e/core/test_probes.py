"""`manage.py timekeeper probe worker|beat` against real Celery processes: 0 while they turn, 1 when frozen."""

from __future__ import annotations

import signal
import subprocess

import pytest

from scheduling.models import SchedulerHeartbeat
from tests import support
from tests.e2e import harness, private_services
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]

MAX_AGE = "8"  # seconds: above the 5 s write period, so only a frozen process fails it


def probe(env: dict[str, str], role: str) -> subprocess.CompletedProcess[str]:
    """``manage.py timekeeper probe <role>`` as the processes see the services."""
    return support.manage("timekeeper", "probe", role, "--max-age", MAX_AGE, env=harness.base_env(env), timeout=120)


@pytest.mark.parametrize("role", ["worker", "beat"])
def test_probe_passes_while_the_process_turns_and_fails_while_it_is_frozen(cluster, role):
    """The probe exits 0 for a running worker or beat, 1 once it is SIGSTOPped, 0 again after SIGCONT."""
    directory = private_services._scratch_dir(f"tk-liveness-{role}-")
    cluster.env = {"SCHEDULING_LIVENESS_DIR": str(directory)}
    proc = cluster.worker() if role == "worker" else cluster.beat()
    if role == "worker":
        wait_ready(proc)
    wait_for(lambda: probe(cluster.env, role).returncode == 0, 60, 1, message=f"the {role} probe to pass")
    if role == "worker":
        wait_for(lambda: SchedulerHeartbeat.objects.filter(role="control").exists(), 30, message="control heartbeat")
    proc.signal(signal.SIGSTOP)
    try:
        failed = wait_for(
            lambda: (done := probe(cluster.env, role)).returncode == 1 and done, 60, 1, message="the probe to fail"
        )
        assert "not alive" in failed.stderr
    finally:
        proc.signal(signal.SIGCONT)
    wait_for(lambda: probe(cluster.env, role).returncode == 0, 60, 1, message=f"the {role} probe to pass again")
