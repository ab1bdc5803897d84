"""A task module nobody imports at start: workers find its tasks by their module path."""

from __future__ import annotations

import os
from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@task
def ping(label: str) -> dict[str, Any]:
    """Return the label and the pid of the process that ran it."""
    return {"label": label, "pid": os.getpid()}


def not_a_task(label: str) -> str:
    """A plain function beside the task: never run as a task."""
    return label
