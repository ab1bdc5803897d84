"""``manage.py timekeeper_kinds``: pause, resume or cap a job kind, or list every kind with its controls."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, transaction

from scheduling import api
from scheduling.core import exceptions


class Command(BaseCommand):
    help = (
        "Operate job kinds: pause KIND (its due jobs stay pending), resume KIND, cap KIND N|none (at most N of "
        "its jobs claimed or running at once, cluster-wide), list [--json] (every kind with its controls and counts)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="verb", required=True, metavar="{pause,resume,cap,list}")
        pause = sub.add_parser("pause", help="Pause a kind: its due jobs stay pending until it is resumed.")
        pause.add_argument("kind", help="A registered kind, e.g. reminders.trial_ending.")
        resume = sub.add_parser("resume", help="Resume a paused kind: its due jobs are claimed again.")
        resume.add_argument("kind", help="A registered kind.")
        cap = sub.add_parser("cap", help="Cap how many jobs of a kind run at once, or 'none' to remove the cap.")
        cap.add_argument("kind", help="A registered kind.")
        cap.add_argument("max_running", help="A whole number from 1 to 1000000, or 'none'.")
        listing = sub.add_parser("list", help="Every kind: paused, cap, due, claimed, running, dead in 24 h.")
        listing.add_argument("--json", action="store_true", help="Print a JSON list instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        verb = options["verb"]
        try:
            if verb == "list":
                self._list(options["json"])
                return
            kind = options["kind"]
            with transaction.atomic():
                if verb == "pause":
                    api.pause(kind)
                    self.stdout.write(f"Paused {kind}: its due jobs stay pending until it is resumed.")
                elif verb == "resume":
                    api.resume(kind)
                    self.stdout.write(f"Resumed {kind}.")
                else:
                    cap = self._cap(options["max_running"])
                    api.set_max_running(kind, cap)
                    self.stdout.write(f"{kind}: at most {cap} running at once." if cap else f"{kind}: no cap.")
        except exceptions.UnknownJobKind as exc:
            raise CommandError(f"{exc} `manage.py timekeeper_kinds list` shows the registered kinds.") from exc
        except exceptions.SchedulingError as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"Cannot reach the job table: {exc}. Is PostgreSQL up and DATABASE_URL right?") from exc

    @staticmethod
    def _cap(text: str) -> int | None:
        if text.lower() == "none":
            return None
        if not (text.isascii() and text.isdecimal()) or len(text) > 7:
            raise CommandError(f"The cap must be a whole number from 1 to 1000000, or 'none'; got {text!r}.")
        return int(text)

    def _list(self, as_json: bool) -> None:
        kinds = api.kind_overview()
        if as_json:
            self.stdout.write(json.dumps([dataclasses.asdict(k) for k in kinds], indent=2))
            return
        header = ("kind", "paused", "cap", "due", "claimed", "running", "dead 24h")
        rows = [
            (
                k.kind,
                "yes" if k.paused else "no",
                str(k.max_running or "none"),
                str(k.due),
                str(k.claimed),
                str(k.running),
                str(k.dead_24h),
            )
            for k in kinds
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
