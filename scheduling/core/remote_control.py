"""What a worker tells anyone on the broker: Celery's remote control, without the settings.

Whoever can publish to the broker can ask every worker ``celery inspect conf`` and ``inspect
report``. Celery answers ``conf`` with every setting its app was configured from, and with
``config_from_object("django.conf:settings", namespace="CELERY")`` that is every Django setting in
clear: ``SECRET_KEY``, the database password, ``FLOWER_BASIC_AUTH``; ``report`` masks by name only
(``FLOWER_BASIC_AUTH`` passes). Remote control stays on, since Flower's worker pages read
``stats``, ``active_queues``, ``registered``, ``scheduled``, ``active``, ``reserved``, ``revoked``
and ``conf`` through it and its pool and rate-limit buttons are control commands; ``install()``
(every worker, at ``worker_init``) replaces what would hand out secrets:

- ``conf`` (alias ``dump_conf``) answers only the Celery settings of ``CONF_KEYS``: pool,
  concurrency, acks, serializers, time limits, queue, zone. None of them holds a secret.
- ``report`` answers the software and platform lines of Celery's report, no settings.
- ``stats`` keeps its broker section without ``transport_options`` values that are not numbers or
  flags (a Sentinel password sits in ``sentinel_kwargs``); Celery already drops the password.

docs/security.md ("Worker remote control") weighs this against turning remote control off.
"""

from __future__ import annotations

import platform
from typing import Any

import billiard
import celery
import kombu
from celery.utils.serialization import jsonify, strtobool
from celery.worker import control
from kombu.utils.encoding import safe_repr

CONF_KEYS = (
    "worker_pool",
    "worker_concurrency",
    "worker_prefetch_multiplier",
    "worker_max_tasks_per_child",
    "worker_max_memory_per_child",
    "worker_eta_task_limit",
    "worker_send_task_events",
    "worker_enable_remote_control",
    "worker_cancel_long_running_tasks_on_connection_loss",
    "task_acks_late",
    "task_reject_on_worker_lost",
    "task_track_started",
    "task_send_sent_event",
    "task_time_limit",
    "task_soft_time_limit",
    "task_serializer",
    "result_serializer",
    "accept_content",
    "result_accept_content",
    "task_default_queue",
    "timezone",
    "enable_utc",
    "broker_connection_retry_on_startup",
)

_celery_stats = control.Panel.data["stats"]


def allowed_conf(app: Any) -> dict[str, Any]:
    """The settings of ``CONF_KEYS`` that ``app`` has, as plain JSON values."""
    known = app.conf
    return {key: jsonify(known[key], unknown_type_filter=safe_repr) for key in CONF_KEYS if key in known}


def conf(state: Any, with_defaults: bool = False, **kwargs: Any) -> dict[str, Any]:
    """The worker's harmless settings (``CONF_KEYS``), whatever ``with_defaults`` asks."""
    return allowed_conf(state.app)


def report(state: Any) -> dict[str, str]:
    """Versions and platform for a bug report; no settings."""
    return control.ok(
        f"software -> celery:{celery.__version__} kombu:{kombu.__version__} py:{platform.python_version()} "
        f"billiard:{billiard.__version__}\nplatform -> system:{platform.system()} arch:{platform.machine()}"
    )


def stats(state: Any, **kwargs: Any) -> dict[str, Any]:
    """Celery's worker statistics, the broker's transport options reduced to numbers and flags."""
    answer = _celery_stats(state, **kwargs)
    broker = answer.get("broker") if isinstance(answer, dict) else None
    if isinstance(broker, dict) and isinstance(broker.get("transport_options"), dict):
        broker["transport_options"] = {
            name: value
            for name, value in broker["transport_options"].items()
            if value is None or isinstance(value, bool | int | float)
        }
    return answer


def install() -> None:
    """Replace ``conf``, ``report`` and ``stats`` in Celery's registry of remote-control commands."""
    control.inspect_command(
        name="conf",
        alias="dump_conf",
        signature="[include_defaults=False]",
        args=[("with_defaults", strtobool)],
    )(conf)
    control.inspect_command(name="report")(report)
    control.inspect_command(name="stats")(stats)
