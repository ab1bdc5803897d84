"""Settings for workers whose run messages (``scheduling.run_batch``) travel on a queue of their own.

As a team routes tasks with ``CELERY_TASK_ROUTES`` (docs/operations.md, "Queues and routing"): the
fault tests' settings, with the batch queue declared beside the default and deferral queues.
"""

from __future__ import annotations

from kombu import Exchange, Queue

from tests.faultkit.worker_settings import *  # noqa: F403 - the fault tests' settings with one route more
from tests.faultkit.worker_settings import CELERY_TASK_QUEUES, CELERY_TASK_ROUTES

BATCH_QUEUE = "timekeeper.batches"
CELERY_TASK_QUEUES = [
    *CELERY_TASK_QUEUES,
    Queue(BATCH_QUEUE, Exchange(BATCH_QUEUE, type="direct"), routing_key=BATCH_QUEUE),
]
CELERY_TASK_ROUTES = {**CELERY_TASK_ROUTES, "scheduling.run_batch": {"queue": BATCH_QUEUE}}
