"""A pool process stopped (SIGSTOP) in the middle of an atomic chunk loses its claims; resumed, it changes nothing.

Real ``celery worker`` and beat (``tests.e2e.harness``), the test kinds of ``tests.faultkit.kinds``.
The chunk's transaction is bounded by the kind's timeout plus ``runner.STALL_MARGIN_SECONDS``
(``store.bound_transaction``): PostgreSQL ends the stopped session and its row locks, the sweeper
takes the claim back after its lease, another process runs the job, and the claim token refuses
what the stopped process tries to write once it resumes.
"""

from __future__ import annotations

import os
import signal

import pytest
from django.db import connection

from scheduling import api
from scheduling.due_at import runner
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready
from tests.faultkit import measure
from tests.faultkit.kinds import handlers as fault_kinds  # registers the test kinds in this process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAST = {
    "DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings",
    "SCHEDULING_HEARTBEAT_SECONDS": "1",
    "SCHEDULING_SWEEP_INTERVAL_SECONDS": "1",
    "CELERY_BROKER_RESTORE_INTERVAL_SECONDS": "1",
}


def _idle_in_chunk() -> int | None:
    """The backend pid of a session idle inside an atomic chunk right after a handler's insert, if any."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction'"
            " AND query LIKE 'INSERT INTO \"tasks_execution\"%%' AND pid <> pg_backend_pid()"
            " AND datname = current_database()"
        )
        row = cursor.fetchone()
        return row[0] if row else None


def _session_alive(backend: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [backend])
        return cursor.fetchone()[0] > 0


def test_a_pool_process_stopped_mid_chunk_loses_its_claim_and_its_late_outcome_is_refused(cluster):
    """SIGSTOP mid-chunk: the session ends, the job is rescued and run once elsewhere; after SIGCONT nothing changes."""
    worker = cluster.worker("w1", concurrency=2, env=FAST)
    cluster.beat(env=FAST)
    wait_ready(worker)
    job = api.schedule("faults.atomic_stall", {"hold": 2.5}, delay=0)
    backend = wait_for(_idle_in_chunk, 30, message="the handler to work inside its chunk's transaction")
    holder = ScheduledJob.objects.get(pk=job.id).claimed_by
    pid = int(holder.rsplit(":", 1)[1])
    assert pid in worker.children()
    first_token = str(ScheduledJob.objects.get(pk=job.id).token)
    stopped_at = measure.db_now()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not _session_alive(backend), 30, message="PostgreSQL to end the stopped chunk's session")
        ended_at = measure.db_now()
        done = wait_for(
            lambda: (j := ScheduledJob.objects.get(pk=job.id)).state == JobState.DONE and j, 45, message="the rescue"
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    (committed,) = Execution.objects.filter(idempotency_key=f"job:{job.id}")
    assert committed.pid != pid, "not by the stopped process"
    assert committed.pid in worker.children(), "run again by the other pool process"
    reclaimed, succeeded = JobAttempt.objects.filter(job_id=job.id).order_by("number")
    assert (reclaimed.outcome, succeeded.outcome) == (AttemptOutcome.RECLAIMED, AttemptOutcome.SUCCEEDED)
    stop_to_reclaim = measure.seconds(reclaimed.finished_at, stopped_at)
    bound = max(fault_kinds.STALL_LEASE_SECONDS, fault_kinds.STALL_TIMEOUT_SECONDS + runner.STALL_MARGIN_SECONDS)
    assert stop_to_reclaim <= bound + 1 + 5, "rescued within max(lease, timeout + margin) + sweep interval (+ slack)"

    # Resumed, the process finds its chunk's transaction gone; giving the claim back is refused by the token.
    wait_for(lambda: "atomic chunk lost" in worker.log(), 30, message="the resumed process to see its chunk ended")
    wait_for(lambda: "outcome refused" in worker.log(), 30, message="its late write to be refused")
    after = ScheduledJob.objects.get(pk=job.id)
    assert (after.state, after.token, after.finished_at) == (JobState.DONE, done.token, done.finished_at)
    assert str(after.token) != first_token
    assert Execution.objects.filter(idempotency_key=f"job:{job.id}").count() == 1, "one committed effect"
    assert JobAttempt.objects.filter(job_id=job.id).count() == 2
    measure.record(
        "2c SIGSTOP a pool process mid atomic chunk, then SIGCONT",
        "its session ended after timeout + margin, the claim swept and run once elsewhere; the resumed "
        "process's late write refused by the token; 1 committed effect",
        timeout_s=fault_kinds.STALL_TIMEOUT_SECONDS,
        margin_s=runner.STALL_MARGIN_SECONDS,
        lease_s=fault_kinds.STALL_LEASE_SECONDS,
        stop_to_session_end_s=measure.seconds(ended_at, stopped_at),
        stop_to_reclaim_s=stop_to_reclaim,
        stop_to_rerun_s=measure.seconds(succeeded.started_at, stopped_at),
    )
