"""Small demonstration kinds: a no-op, a recorder of executions, a failure and a sleeper.

They make the platform's behaviour visible in the demo data and measurable in tests and
benchmarks: ``demo.record`` writes one ``Execution`` row per run, so "ran twice" is countable.
``demo.noop`` and ``demo.record`` may be scheduled through the JSON API by any user (``Access()``),
with the kind's own attempts and priority at most (one job holds a worker 10 s x 5 and 60 s x 3 at
worst; ``demo.record`` sleeps at most its timeout); ``demo.fail`` and ``demo.sleep`` only from code
or by a superuser in the admin.
"""

from __future__ import annotations

import os
import time

from scheduling import registry
from tasks.models import Execution

RECORD_TIMEOUT_SECONDS = 60
EXPORTS_QUEUE = "exports"  # demo.export's named queue (and its Celery queue)
RECORD_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "maxLength": 200},
        # Bounded by the timeout: a longer sleep would only be cut off, holding a worker until then.
        "sleep": {"type": "number", "minimum": 0, "maximum": RECORD_TIMEOUT_SECONDS},
    },
    "additionalProperties": True,
}


@registry.handler("demo.noop", schema={"type": "object"}, timeout=10, batch_size=100, api=registry.Access())
def noop(job: registry.Job) -> None:
    """Do nothing (throughput and lag measurements)."""


@registry.handler(
    "demo.record",
    schema=RECORD_SCHEMA,
    timeout=RECORD_TIMEOUT_SECONDS,
    max_attempts=3,
    backoff=registry.Backoff(1, 5),
    api=registry.Access(),
)
def record(job: registry.Job) -> None:
    """Record that this job ran (one row per execution), optionally after sleeping."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    if job.payload.get("sleep"):
        time.sleep(float(job.payload["sleep"]))


# The same work committing as it goes (atomic=False): its row is visible while it runs, and its
# outcome is written afterwards in a statement of its own (retried while the database is away).
registry.handler(
    "demo.record_committing",
    schema=RECORD_SCHEMA,
    timeout=RECORD_TIMEOUT_SECONDS,
    max_attempts=3,
    backoff=registry.Backoff(1, 5),
    atomic=False,
)(record)


class DemoFailure(RuntimeError):
    """The failure ``demo.fail`` raises on purpose."""


@registry.handler(
    "demo.fail", schema={"type": "object"}, timeout=10, max_attempts=3, backoff=registry.Backoff(1, 2), atomic=False
)
def fail(job: registry.Job) -> None:
    """Fail every time (to show retries with backoff and the dead state); each try's row is kept (atomic=False)."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    raise DemoFailure(f"attempt {job.attempt} of {job.max_attempts} failed on purpose")


@registry.handler(
    "demo.sleep",
    schema={"type": "object"},
    timeout=2,
    max_attempts=2,
    backoff=registry.Backoff(1, 2),
    batch_size=1,
    atomic=False,  # every try leaves its Execution row, so a test sees each timed-out attempt
)
def sleep(job: registry.Job) -> None:
    """Sleep for payload["seconds"] (to show the timeout stopping a handler)."""
    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    time.sleep(float(job.payload.get("seconds", 5)))


def choose(job: registry.Job) -> None:
    """Record this call, then choose an outcome: snooze until ``snooze_until`` (ISO time), or cancel.

    Shows the handler-chosen outcomes (docs/architecture.md): an atomic job's row rolls back with a
    snooze or a cancel, a committing job's stays.
    """
    import datetime as dt

    Execution.objects.create(idempotency_key=job.idempotency_key, kind=job.kind, pid=os.getpid())
    until = job.payload.get("snooze_until")
    if until and dt.datetime.now(dt.UTC) < dt.datetime.fromisoformat(until):
        raise registry.Snooze(0.5)
    if job.payload.get("cancel"):
        raise registry.Cancel(str(job.payload["cancel"]))


registry.handler("demo.choose", schema={"type": "object"}, timeout=10, max_attempts=2)(choose)
registry.handler("demo.choose_committing", schema={"type": "object"}, timeout=10, max_attempts=2, atomic=False)(choose)


# A kind of its own named queue: its batches go to the Celery queue "exports", served only by the
# workers started with `-Q exports` (docker-compose.yml's worker-exports, deploy/kubernetes/worker-exports.yaml).
registry.handler(
    "demo.export",
    schema=RECORD_SCHEMA,
    timeout=RECORD_TIMEOUT_SECONDS,
    max_attempts=3,
    backoff=registry.Backoff(1, 5),
    queue=EXPORTS_QUEUE,
)(record)
