"""The Celery app Flower runs with in production (``celery -A project.flower_app flower``).

Flower needs the broker and nothing else. ``project.celery``'s app reads Django's settings, which
need ``SECRET_KEY`` and the database URL; this one is built from ``CELERY_BROKER_URL`` alone, so the
Flower container holds neither. Without the key it cannot sign a deferral: a ``scheduling.run_deferred``
sent through Flower's task API is refused by the worker (``scheduling.deferrals.countdowns``), and
with no task registered here its "apply" API knows no Timekeeper task at all.
"""

from __future__ import annotations

import os

from celery import Celery

from project import env

BROKER_URL = os.environ.get("CELERY_BROKER_URL") or env.DEFAULT_BROKER_URL

# fixups=[]: no Django fix-up (importing ``project`` sets DJANGO_SETTINGS_MODULE, which would make
# Celery load Django's settings when Flower starts, and those need SECRET_KEY).
app = Celery("timekeeper-flower", broker=env.parse_broker_url(BROKER_URL), fixups=[])
app.conf.update(
    accept_content=["json"],  # as the workers: JSON only, never pickle
    task_serializer="json",
    result_serializer="json",
    broker_connection_retry_on_startup=True,
)
prefix = os.environ.get("CELERY_BROKER_KEYPREFIX", "")
if prefix:
    app.conf.broker_transport_options = {"global_keyprefix": prefix}
