"""Timekeeper's tables, one module per mechanism; ``from scheduling.models import X`` reaches every one.

Per-entity future work (``due_at``) is a ``ScheduledJob`` row with a ``due_at``; each try is a
``JobAttempt``; ``KindControl`` pauses or caps a kind. Fixed-time work (``fixed``) is a
django-celery-beat ``PeriodicTask`` with a ``SchedulePolicy`` beside it and a ``ScheduleRun`` per
(schedule, tick); ``SchedulerHeartbeat`` records the leading beat process. Recurring work
(``recurring``) is a ``Recurrence`` whose occurrences are ``ScheduledJob`` rows. The JSON API's
tokens and rate buckets are in ``access``, the ``/metrics`` counters in ``counters``,
the operators' audit trail in ``audit``.

Invariants are database constraints; every state change is a conditional UPDATE in a ``store``.
The public names are each module's ``__all__``, listed once there.
"""

# isort: off
# Imported in the order the tables were declared when this package was one module, so Django
# registers the models (and creates their content types and permissions) in the same order.
from scheduling.models import due_at, fixed, access, counters, recurring, audit
from scheduling.models.due_at import *  # noqa: F403
from scheduling.models.fixed import *  # noqa: F403
from scheduling.models.access import *  # noqa: F403
from scheduling.models.counters import *  # noqa: F403
from scheduling.models.recurring import *  # noqa: F403
from scheduling.models.audit import *  # noqa: F403
# isort: on

__all__ = [*due_at.__all__, *fixed.__all__, *access.__all__, *counters.__all__, *recurring.__all__, *audit.__all__]
