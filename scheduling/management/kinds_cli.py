"""``manage.py timekeeper kinds``: pause, resume or cap a job kind, or list every kind with its controls."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import transaction

from scheduling import api
from scheduling.core import exceptions, registry

HELP = (
    "Operate job kinds: pause KIND (its due jobs stay pending), resume KIND, cap KIND N|none (at most N of "
    "its jobs claimed or running at once, cluster-wide), rate KIND 10/s|none "
    "[--partition-by FIELD] (at most so many starts per period, cluster-wide), list [--json] (every kind with "
    "its controls and counts)."
)
MAX_CAP = 1_000_000  # the largest cap `kinds cap` takes (api.set_max_running's bound)


def add_arguments(parser: CommandParser) -> None:
    """The verbs of ``timekeeper kinds`` (and of its old name, ``timekeeper_kinds``)."""
    sub = parser.add_subparsers(dest="verb", required=True, metavar="{list,pause,resume,cap,rate}")
    listing = sub.add_parser("list", help="Every kind: paused, cap, due, claimed, running, dead in 24 h.")
    listing.add_argument("--json", action="store_true", help="Print a JSON list instead of a table.")
    pause = sub.add_parser("pause", help="Pause a kind: its due jobs stay pending until it is resumed.")
    pause.add_argument("kind", help="A registered kind, e.g. reminders.trial_ending.")
    resume = sub.add_parser("resume", help="Resume a paused kind: its due jobs are claimed again.")
    resume.add_argument("kind", help="A registered kind.")
    cap = sub.add_parser("cap", help="Cap how many jobs of a kind run at once, or 'none' to remove the cap.")
    cap.add_argument("kind", help="A registered kind.")
    cap.add_argument("max_running", help=f"A whole number from 1 to {MAX_CAP}, or 'none'.")
    rate = sub.add_parser("rate", help="Limit how many jobs of a kind start per period, or 'none' to lift it.")
    rate.add_argument("kind", help="A registered kind.")
    rate.add_argument("rate", help="Starts per period: 10/s, 1/m, 100/h, 5/2s; or 'none'.")
    rate.add_argument("--partition-by", default="", help="A payload field: the limit holds per value of it.")


def run(command: Any, options: dict[str, Any]) -> None:
    """Carry out ``timekeeper kinds <verb>``; bad input is a CommandError and changes nothing."""
    verb = options["verb"]
    out = command.stdout
    if verb == "list":
        _list(out, options["json"])
        return
    kind = options["kind"]
    try:
        with transaction.atomic():
            if verb == "pause":
                api.pause(kind)
                out.write(f"Paused {kind}: its due jobs stay pending until it is resumed.")
            elif verb == "resume":
                api.resume(kind)
                out.write(f"Resumed {kind}.")
            elif verb == "rate":
                text = options["rate"]
                given = None if text.lower() == "none" else registry.Rate.parse(text, options["partition_by"])
                api.set_rate(kind, given)
                out.write(f"{kind}: at most {given}." if given else f"{kind}: no rate limit.")
            else:
                cap = _cap(options["max_running"])
                api.set_max_running(kind, cap)
                out.write(f"{kind}: at most {cap} running at once." if cap else f"{kind}: no cap.")
    except exceptions.UnknownJobKind as exc:
        raise CommandError(f"{exc} `manage.py timekeeper kinds list` shows the registered kinds.") from exc
    except exceptions.SchedulingError as exc:
        raise CommandError(str(exc)) from exc


def _cap(text: str) -> int | None:
    if text.lower() == "none":
        return None
    if not (text.isascii() and text.isdecimal()) or len(text) > len(str(MAX_CAP)):
        raise CommandError(f"The cap must be a whole number from 1 to {MAX_CAP}, or 'none'; got {text!r}.")
    return int(text)


def _list(out: Any, as_json: bool) -> None:
    kinds = api.kind_overview()
    if as_json:
        out.write(json.dumps([dataclasses.asdict(k) for k in kinds], indent=2))
        return
    header = ("kind", "paused", "cap", "rate", "due", "claimed", "running", "dead 24h")
    rows = [
        (
            k.kind,
            "yes" if k.paused else "no",
            str(k.max_running or "none"),
            k.rate or "none",
            str(k.due),
            str(k.claimed),
            str(k.running),
            str(k.dead_24h),
        )
        for k in kinds
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
