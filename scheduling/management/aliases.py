"""The old command names, kept as aliases of ``manage.py timekeeper <subcommand>``.

``scheduling_status`` is ``timekeeper status``, ``sync_schedules`` is ``timekeeper sync`` and
``timekeeper_kinds`` is ``timekeeper kinds``: the same arguments (added by the same function) and the
same code (``timekeeper.Command.handle``), after one line on stderr naming the new form. Scripts and
deploy jobs that still call the old names keep working; the docs use the new forms only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandParser

from scheduling.management.commands import timekeeper

# old command name -> the timekeeper subcommand it runs
ALIASES = {"scheduling_status": "status", "sync_schedules": "sync", "timekeeper_kinds": "kinds"}


def deprecation(old: str) -> str:
    """The one line an alias prints on stderr."""
    return f"`manage.py {old}` is deprecated: run `manage.py timekeeper {ALIASES[old]}` (same arguments)."


def alias(old: str, help_text: str, add_arguments: Callable[[CommandParser], None]) -> type[timekeeper.Command]:
    """A Command class for the old name ``old``: the subcommand's arguments, a deprecation line, the same code."""
    subcommand = ALIASES[old]

    class Command(timekeeper.Command):
        help = f"Deprecated alias of `manage.py timekeeper {subcommand}`. {help_text}"

        def add_arguments(self, parser: CommandParser) -> None:
            add_arguments(parser)

        def handle(self, *args: Any, **options: Any) -> None:
            self.stderr.write(deprecation(old))
            super().handle(*args, **{**options, "subcommand": subcommand})

    Command.__qualname__ = Command.__name__ = "Command"
    return Command
