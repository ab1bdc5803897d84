"""The bare Celery baseline with a real handler: one ORM insert per task, no table of jobs.

``celery -A bench.celery_orm worker`` runs ``bare.record``, which writes one ``tasks.Execution``
row through the Django ORM (the same model and fields as ``demo.record``), on the bench database.
The delivery configuration comes from ``BENCH_BARE_MODE``:

- ``reliable``: the platform's delivery settings (late acks, reject on worker lost, prefetch 1);
- ``default``: Celery's defaults (early acks, prefetch multiplier 4), which lose a task whose
  worker dies mid-run.

Both modes keep their database connection between tasks (``CELERY_DB_REUSE_MAX``): Celery's Django
fixup otherwise closes it before and after every task, and a new connection per task (about 2 ms
here) would make the baseline several times slower than a tuned Celery deployment (measured: about
130 tasks/s instead of 900). The baseline is Celery at its best, not at its default.

The broker is the bare Redis database of ``bench.celery_bare`` (queues never mix with the platform's).
"""

from __future__ import annotations

import os
from typing import Any

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()

from tasks.models import Execution  # noqa: E402 - Django must be set up before models are imported

BROKER = os.environ.get("BENCH_BARE_BROKER_URL", "redis://127.0.0.1:6379/13")
QUEUE = "bare_orm"
MODES = {
    "reliable": {"task_acks_late": True, "task_reject_on_worker_lost": True, "worker_prefetch_multiplier": 1},
    "default": {"task_acks_late": False, "task_reject_on_worker_lost": False, "worker_prefetch_multiplier": 4},
}
MODE = os.environ.get("BENCH_BARE_MODE", "reliable")
DB_REUSE_MAX = 1_000_000  # tasks between connection closes by Celery's Django fixup (CONN_MAX_AGE still applies)

app = Celery("bench_orm", broker=BROKER)
app.conf.update(
    accept_content=["json"],
    task_serializer="json",
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue=QUEUE,
    **MODES[MODE],
)
# Read by Celery's Django fixup under this (old-style) name only; without it the connection is closed per task.
app.conf.CELERY_DB_REUSE_MAX = DB_REUSE_MAX


def connection() -> Any:
    """A broker connection to the bare database with the queue declared (see ``celery_bare.connection``)."""
    conn = app.connection_for_write(BROKER)
    app.amqp.queues[QUEUE](conn.default_channel).declare()
    return conn


def worker_env(mode: str) -> dict[str, str]:
    """Environment for a worker in ``mode`` (Celery reads CELERY_BROKER_URL before its own configuration)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: one of {sorted(MODES)}")
    return {"CELERY_BROKER_URL": BROKER, "BENCH_BARE_BROKER_URL": BROKER, "BENCH_BARE_MODE": mode}


@app.task(name="bare.record", ignore_result=True)
def record(key: str) -> None:
    """Write one Execution row (what ``demo.record`` does, without the platform)."""
    Execution.objects.create(idempotency_key=key, kind="bare.record", pid=os.getpid())
