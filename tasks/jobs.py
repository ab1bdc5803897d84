"""The demo product's job handlers, found the Django way: Timekeeper imports the ``jobs`` module of
every installed app (``scheduling.core.registry.autodiscover``), as the admin imports ``admin``.

Each module below registers its kinds with ``@registry.handler`` (and its fixed-time schedules with
``schedules.declare``) when imported.
"""

from __future__ import annotations

from tasks import demo, payments, reminders, reports

__all__ = ["demo", "payments", "reminders", "reports"]
