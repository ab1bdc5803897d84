"""Job kinds for the fault tests: an idempotent effect that can hold its worker, and poison pills.

Every kind records one ``tasks.Execution`` row per execution (never deduplicated: how a test counts
"ran twice") before doing anything else; ``faults.effect``'s side effect is a ``Notification`` unique
per job, so "one side effect" is countable too. They commit as they go (``atomic=False``): a killed
attempt's Execution row stays, which is how a test sees the re-run. The leases are short (seconds) so that faults
recover within a test; workers must heartbeat more often than that (SCHEDULING_HEARTBEAT_SECONDS=1).
"""

from __future__ import annotations

import os
import signal
import time

from django.db import IntegrityError, connection, transaction

from scheduling import registry
from tasks.models import Execution, Notification

EFFECT_SCHEMA = {
    "type": "object",
    "properties": {
        "hold": {"type": "number", "minimum": 0, "maximum": 120},
        "hold_on": {"type": "array", "items": {"type": "integer", "minimum": 1}},
    },
    "additionalProperties": False,
}
EFFECT_LEASE_SECONDS = 3
POISON_LEASE_SECONDS = 2
POISON_MAX_ATTEMPTS = 3
BATCH_MAX_ATTEMPTS = 2
BATCH_SIZE = 10


def effect(job: registry.Job) -> None:
    """Record the execution, send one notification per job, then hold ``hold`` s on the attempts in ``hold_on``."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    try:
        with transaction.atomic():
            # The worker's own wall clock goes in the subject: the clock-skew test reads it back.
            Notification.objects.create(
                idempotency_key=job.idempotency_key, subject=f"attempt {job.attempt} worker-clock {time.time():.3f}"
            )
    except IntegrityError:
        pass  # a re-run of a job whose notification was already sent: nothing more to do
    if job.attempt in job.payload.get("hold_on", [1]):
        time.sleep(float(job.payload.get("hold", 0)))


registry.handler(
    "faults.effect",
    schema=EFFECT_SCHEMA,
    timeout=60,
    max_attempts=3,
    backoff=registry.Backoff(1, 2),
    lease_seconds=EFFECT_LEASE_SECONDS,
    batch_size=1,
    atomic=False,
)(effect)
# The same in batches of four (a stopping worker's batch: one job running, the rest waiting).
SHARED_BATCH_SIZE = 4
registry.handler(
    "faults.batch_effect",
    schema=EFFECT_SCHEMA,
    timeout=60,
    max_attempts=1,
    backoff=registry.Backoff(1, 2),
    lease_seconds=EFFECT_LEASE_SECONDS,
    batch_size=SHARED_BATCH_SIZE,
    atomic=False,
)(effect)

# The same with a short timeout (the claim loop used to run such kinds itself; tests keep both).
registry.handler(
    "faults.effect_inline",
    schema=EFFECT_SCHEMA,
    timeout=10,
    max_attempts=3,
    backoff=registry.Backoff(1, 2),
    lease_seconds=EFFECT_LEASE_SECONDS,
    batch_size=1,
    atomic=False,
)(effect)


def atomic_effect(job: registry.Job) -> None:
    """Record the execution in the batch's transaction; hold ``hold`` s in PostgreSQL on the attempts in ``hold_on``.

    The hold is a ``pg_sleep`` on the job's own connection, so a test sees the job running in
    ``pg_stat_activity`` while none of its writes are visible yet.
    """
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    if job.attempt in job.payload.get("hold_on", [1]) and job.payload.get("hold"):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s) AS faults_atomic_hold", [float(job.payload["hold"])])


# Atomic (the default): the Execution rows of a batch's chunk commit with the jobs' outcomes.
registry.handler(
    "faults.atomic_effect",
    schema=EFFECT_SCHEMA,
    timeout=60,
    max_attempts=3,
    backoff=registry.Backoff(1, 2),
    lease_seconds=EFFECT_LEASE_SECONDS,
    batch_size=5,
)(atomic_effect)


@registry.handler(
    "faults.poison",
    schema={"type": "object"},
    timeout=30,
    max_attempts=POISON_MAX_ATTEMPTS,
    backoff=registry.Backoff(1, 2),  # a crash is retried after the backoff: short, so the test ends soon
    lease_seconds=POISON_LEASE_SECONDS,
    batch_size=1,
    atomic=False,
)
def poison(job: registry.Job) -> None:
    """Record the execution, then SIGKILL the process running it (every time)."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)


@registry.handler("faults.session", schema={"type": "object"}, timeout=10, max_attempts=3, batch_size=1)
def session(job: registry.Job) -> None:
    """Record which PostgreSQL session ran the job: Execution.pid holds the backend's pid, not the worker's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=backend)


STALL_TIMEOUT_SECONDS = 3
STALL_LEASE_SECONDS = 3


def atomic_stall(job: registry.Job) -> None:
    """Record the execution in the chunk's transaction, then work ``hold`` s in Python (idle in transaction)."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    if job.attempt in job.payload.get("hold_on", [1]):
        time.sleep(float(job.payload.get("hold", 0)))


# Atomic, with a short timeout: a stalled chunk's transaction is ended timeout + runner.STALL_MARGIN_SECONDS
# after its last statement, so the SIGSTOP test sees the rescue within seconds.
registry.handler(
    "faults.atomic_stall",
    schema=EFFECT_SCHEMA,
    timeout=STALL_TIMEOUT_SECONDS,
    max_attempts=3,
    backoff=registry.Backoff(1, 2),
    lease_seconds=STALL_LEASE_SECONDS,
    batch_size=5,
)(atomic_stall)


@registry.handler(
    "faults.batch_member",
    schema={"type": "object", "properties": {"poison": {"type": "boolean"}}, "additionalProperties": False},
    timeout=30,
    max_attempts=BATCH_MAX_ATTEMPTS,
    backoff=registry.Backoff(1, 2),
    lease_seconds=POISON_LEASE_SECONDS,
    batch_size=BATCH_SIZE,
)
def batch_member(job: registry.Job) -> None:
    """Atomic: record the execution in the chunk's transaction; a ``poison`` job then SIGKILLs its process."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    if job.payload.get("poison"):
        os.kill(os.getpid(), signal.SIGKILL)


FAIL_FIRST_BACKOFF_SECONDS = 20  # the first attempt's retry waits this long: long beside a 2 s recurrence


@registry.handler(
    "faults.fail_first",
    schema={"type": "object", "properties": {"hold": {"type": "number", "minimum": 0, "maximum": 5}}},
    timeout=10,
    max_attempts=3,
    backoff=registry.Backoff(FAIL_FIRST_BACKOFF_SECONDS, FAIL_FIRST_BACKOFF_SECONDS),
    lease_seconds=EFFECT_LEASE_SECONDS,
    batch_size=1,
    atomic=False,
)
def fail_first(job: registry.Job) -> None:
    """Record the execution, then fail the first attempt on purpose after ``hold`` s (its retry waits the backoff)."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    if job.attempt == 1:
        time.sleep(float(job.payload.get("hold", 0)))
        raise RuntimeError("the first attempt fails on purpose")


DB_SLEEP_TIMEOUT_SECONDS = 2


def db_sleep(job: registry.Job) -> None:
    """Record an Execution row in the same statement as a ``pg_sleep`` of ``seconds``: kept only if it returns."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks_execution (idempotency_key, kind, pid, started_at) "
            "SELECT %s, %s, pg_backend_pid(), now() FROM pg_sleep(%s)",
            [job.idempotency_key, job.kind, float(job.payload.get("seconds", 12))],
        )


for _name, _atomic in (("faults.db_sleep", True), ("faults.db_sleep_committing", False)):
    registry.handler(
        _name,
        schema={"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 60}}},
        timeout=DB_SLEEP_TIMEOUT_SECONDS,
        max_attempts=1,
        batch_size=1,
        atomic=_atomic,
    )(db_sleep)


@registry.handler("faults.new_release", schema={"type": "object"}, timeout=10, max_attempts=1, batch_size=1)
def new_release(job: registry.Job) -> None:
    """A kind only the new release knows (a rolling deploy's test): record the execution."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
