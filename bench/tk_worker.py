"""The platform's Celery app for benchmark workers that need to see the control loop's sweeps.

``celery -A bench.tk_worker worker`` is ``celery -A project worker`` plus the control loop's logger
at DEBUG (its "sweep ran" line, one per sweep), without DEBUG anywhere else (Django's SQL log would
distort the figures).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from project.celery import app

__all__ = ["app"]


@signals.worker_ready.connect
def _log_sweeps(**kwargs: Any) -> None:
    logging.getLogger("scheduling.due_at.control").setLevel(logging.DEBUG)
