"""A handler's timeout holds inside a database statement, under both pools a worker may run (prefork, solo).

Real ``celery worker`` processes with the test kinds of ``tests.faultkit.kinds``: ``faults.db_sleep``
(atomic) and ``faults.db_sleep_committing`` insert their Execution row in the same statement as a
``pg_sleep`` far past their 2 s timeout. libpq retries its wait on EINTR, so SIGALRM alone lands only
when the statement returns: the committing kind's row would be kept after 12 s, and the atomic one
would run until its chunk's bound (timeout + ``runner.STALL_MARGIN_SECONDS``) ended the statement.
The executor's watchdog cancels the statement at the deadline (``executor._Watchdog``).
"""

from __future__ import annotations

import pytest

from scheduling import api
from scheduling.due_at import runner
from scheduling.models import AttemptOutcome, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready
from tests.faultkit.kinds import handlers as fault_kinds  # registers the test kinds in this process

pytestmark = [pytest.mark.e2e]

WORKER_ENV = {"DJANGO_SETTINGS_MODULE": "tests.faultkit.worker_settings"}
SLEEP_SECONDS = 12


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_a_handler_stuck_in_a_statement_is_stopped_at_its_timeout(cluster, pool):
    """A 2 s timeout ends a pg_sleep(12), atomic or committing: timed out, before its chunk's bound, nothing kept."""
    worker = cluster.worker("w1", pool=pool, env=WORKER_ENV)
    wait_ready(worker)
    kinds = ("faults.db_sleep", "faults.db_sleep_committing")
    jobs = [api.schedule(kind, {"seconds": SLEEP_SECONDS}, delay=0) for kind in kinds]
    for job in jobs:
        wait_for(
            lambda job=job: ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD,
            60,
            message=f"the worker to time {job.kind} out ({worker.log_path})",
        )
    # Halfway to the chunk's bound: the timeout (plus the watchdog's grace), not the bound, ended it.
    bound = fault_kinds.DB_SLEEP_TIMEOUT_SECONDS + runner.STALL_MARGIN_SECONDS / 2
    for job in jobs:
        (attempt,) = JobAttempt.objects.filter(job_id=job.id)
        assert (attempt.outcome, attempt.error) == (AttemptOutcome.TIMED_OUT, "timed out after 2s"), job.kind
        ran = (attempt.finished_at - attempt.started_at).total_seconds()
        assert ran < bound, f"{job.kind} ran {ran:.1f} s: its statement outlived its timeout"
    assert not Execution.objects.filter(idempotency_key__in=[f"job:{j.id}" for j in jobs]).exists()
