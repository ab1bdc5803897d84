"""``manage.py sync_schedules``: deprecated alias of ``manage.py timekeeper sync``."""

from __future__ import annotations

from scheduling.management import aliases, schedules_cli

Command = aliases.alias("sync_schedules", schedules_cli.SYNC_HELP, schedules_cli.add_sync_arguments)
