"""``manage.py timekeeper_kinds``: deprecated alias of ``manage.py timekeeper kinds``."""

from __future__ import annotations

from scheduling.management import aliases, kinds_cli

Command = aliases.alias("timekeeper_kinds", kinds_cli.HELP, kinds_cli.add_arguments)
