"""The Celery app: `celery -A project worker` and `celery -A project beat` start from here.

Configuration comes from Django settings under the CELERY_ namespace (JSON only, late acks,
prefetch 1, an explicit visibility timeout). Timekeeper's own Celery tasks live in
``scheduling.workers``; job handlers in ``tasks/`` are discovered by ``scheduling.registry``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("timekeeper")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["scheduling"], related_name="workers")
