"""System checks of the recurrence settings: ``scheduling.E010`` (cannot work), ``scheduling.W009`` (misses).

Registered on import; ``scheduling.apps`` imports this module in ``ready()``.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from scheduling.core import conf


@checks.register()
def check_recurrence_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The planner needs a positive batch and interval; a late window shorter than its pace misses occurrences."""
    settings = conf.get()
    problems: list[checks.CheckMessage] = []
    if settings.recurrence_plan_batch_size < 1 or settings.recurrence_plan_interval_seconds <= 0:
        problems.append(
            checks.Error(
                "SCHEDULING_RECURRENCE_PLAN_BATCH_SIZE must be at least 1 and "
                "SCHEDULING_RECURRENCE_PLAN_INTERVAL_SECONDS above 0, got "
                f"{settings.recurrence_plan_batch_size} and {settings.recurrence_plan_interval_seconds}.",
                hint="The planner would plan nothing (or spin): recurrences would stop after their next occurrence.",
                id="scheduling.E010",
            )
        )
    pace = settings.recurrence_plan_interval_seconds + settings.claim_interval_seconds
    if settings.recurrence_late_seconds < pace:
        problems.append(
            checks.Warning(
                f"SCHEDULING_RECURRENCE_LATE_SECONDS ({settings.recurrence_late_seconds}) is shorter than the "
                f"planner's and the claim's intervals together ({pace} s).",
                hint="An occurrence planned at the planner's ordinary pace would count as missed and, with "
                "missed='skip', not run. Raise SCHEDULING_RECURRENCE_LATE_SECONDS.",
                id="scheduling.W009",
            )
        )
    return problems
