"""The Celery app: `celery -A project worker` and `celery -A project beat` start from here.

Configuration comes from Django settings under the CELERY_ namespace (JSON only, late acks,
prefetch 1, an explicit visibility timeout). Timekeeper's own Celery tasks live in
``scheduling.tasks``; job handlers in ``tasks/`` are discovered by ``scheduling.registry``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from kombu import Connection

from project import preflight

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

_maybe_close_channel = Connection.maybe_close_channel


def _close_channel_of_detached_connection(self: Connection, channel: Any) -> None:
    """Celery 5.7.0 closes a lost broker connection again after ``collect()`` detached its transport.

    Closing the Redis channel then tries to restore the unacknowledged messages through that
    transport, raises AttributeError ('NoneType' object has no attribute 'hostname'), and the worker
    exits with "Unrecoverable error" instead of reconnecting (a Redis restart stops every worker
    holding a countdown or a late-acked task). Celery 5.6 stopped at ``collect()``; so do we. The
    messages stay in Redis's unacked hash; once the worker is connected again its reconnect step
    (``scheduling.core.reconnect``) acknowledges those that finished and puts the others back.
    """
    try:
        _maybe_close_channel(self, channel)
    except AttributeError:
        if self._transport is not None:  # only the detached case is known and harmless
            raise


Connection.maybe_close_channel = _close_channel_of_detached_connection  # type: ignore[method-assign]

app = Celery("timekeeper")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # finds scheduling.tasks (and any installed app's tasks.py)


@app.on_configure.connect
def _check_settings(**kwargs: Any) -> None:
    """Every ``celery`` command reads the settings first: a wrong one is one line and exit status 78."""
    with preflight.exit_on_error():
        preflight.check_settings()


@signals.import_modules.connect(sender=app)
def _check_services(**kwargs: Any) -> None:
    """A worker or beat initialising (``loader.init_worker``) first reaches PostgreSQL and Redis, or exits in one line.

    This runs before the worker builds its consumer and before beat builds its scheduler, which
    would otherwise retry the broker for minutes or die in a traceback on the database.
    """
    with preflight.exit_on_error():
        preflight.check_services()
