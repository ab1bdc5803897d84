"""``manage.py scheduling_status``: deprecated alias of ``manage.py timekeeper status``."""

from __future__ import annotations

from scheduling.management import aliases, status_cli

Command = aliases.alias("scheduling_status", status_cli.HELP, status_cli.add_arguments)
