"""System checks with stable ids, run by every ``manage.py`` command and at worker start.

- scheduling.E001: the default database is not PostgreSQL.
- scheduling.E002: Celery accepts or produces pickle (or any non-JSON content).
- scheduling.E003: the broker delay ceiling does not sit below the visibility timeout with a margin.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from scheduling.deferrals import countdowns


@checks.register(checks.Tags.database, deploy=False)
def check_database_is_postgresql(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """SKIP LOCKED, advisory locks and partial indexes need PostgreSQL."""
    vendor = connections["default"].vendor
    if vendor != "postgresql":
        return [
            checks.Error(
                f"The default database is {vendor}; Timekeeper needs PostgreSQL.",
                hint="Set DATABASE_URL to a postgresql:// URL.",
                id="scheduling.E001",
            )
        ]
    return []


@checks.register()
def check_json_only(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A pickle message from the broker is code execution; only JSON may be accepted or produced."""
    errors: list[checks.CheckMessage] = []
    accepted = [str(c).lower() for c in getattr(settings, "CELERY_ACCEPT_CONTENT", ["json"])]
    result_accepted = [str(c).lower() for c in getattr(settings, "CELERY_RESULT_ACCEPT_CONTENT", None) or accepted]
    bad = sorted({c for c in accepted + result_accepted if c not in {"json", "application/json"}})
    for name in ("CELERY_TASK_SERIALIZER", "CELERY_RESULT_SERIALIZER"):
        value = str(getattr(settings, name, "json")).lower()
        if value != "json":
            bad.append(f"{name}={value}")
    if bad:
        errors.append(
            checks.Error(
                f"Celery is configured to accept or produce non-JSON content: {', '.join(bad)}.",
                hint="Set CELERY_ACCEPT_CONTENT = ['json'] and the task/result serializers to 'json'.",
                id="scheduling.E002",
            )
        )
    return errors


@checks.register()
def check_delay_ceiling(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A countdown that outlives the visibility timeout is redelivered again and again (celery #2599, #4400)."""
    problem = countdowns.ceiling_problem()
    if problem is None:
        return []
    return [
        checks.Error(
            problem,
            hint="Lower the ceiling or raise CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS. Until this passes, "
            "workers refuse to start and defer() refuses such delays.",
            id="scheduling.E003",
        )
    ]
