"""``manage.py sync_schedules``: write the fixed-time schedules declared in code into the database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling.core import exceptions
from scheduling.fixed import declarations


class Command(BaseCommand):
    help = (
        "Create or update the fixed-time schedules declared in code (declarations.declare in the handler "
        "packages): their crontab (with its time zone) or interval, periodic task and policy. Idempotent: "
        "a schedule that already matches its declaration is not written. Run at every deploy."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "names",
            nargs="*",
            metavar="NAME",
            help="Only sync these declared schedules (default: all of them).",
        )
        parser.add_argument(
            "--disable-undeclared",
            action="store_true",
            help="Also disable fixed-time periodic tasks that no declaration names any more (history is kept).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = declarations.sync(options["names"] or None, disable_undeclared=options["disable_undeclared"])
        except (
            exceptions.InvalidCronExpression,
            exceptions.UnknownTimeZone,
            exceptions.InvalidSchedule,
            exceptions.InvalidPolicy,
            exceptions.InvalidPayload,
            exceptions.UnknownJobKind,
        ) as exc:
            raise CommandError(f"{exc} Fix the declaration (declarations.declare in tasks/) and run again.") from exc
        for label, names in (
            ("created", report.created),
            ("updated", report.updated),
            ("unchanged", report.unchanged),
            ("disabled", report.disabled),
        ):
            if names:
                self.stdout.write(f"{label}: {', '.join(names)}")
        total = len(report.created) + len(report.updated) + len(report.unchanged)
        self.stdout.write(self.style.SUCCESS(f"{total} schedule(s) in sync."))
