"""``manage.py timekeeper kinds``: pause, resume or cap a job kind, or list every kind with its controls."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import transaction

from scheduling import api
from scheduling.core import exceptions, kind_options, registry

_SETTERS = ", ".join(f"{o.verb} KIND N|none ({o.describe('N')})" for o in kind_options.KIND_OPTIONS)
HELP = (
    f"Operate job kinds: pause KIND (its due jobs stay pending), resume KIND, {_SETTERS}, "
    "rate KIND 10/s|none [--partition-by FIELD] (at most so many starts per period, cluster-wide), "
    "list [--json] (every kind with its controls and counts)."
)


def add_arguments(parser: CommandParser) -> None:
    """The verbs of ``timekeeper kinds`` (and of its old name, ``timekeeper_kinds``)."""
    verbs = ["list", "pause", "resume", *(o.verb for o in kind_options.KIND_OPTIONS), "rate"]
    sub = parser.add_subparsers(dest="verb", required=True, metavar="{" + ",".join(verbs) + "}")
    names = ", ".join(o.noun for o in kind_options.KIND_OPTIONS)
    listing = sub.add_parser("list", help=f"Every kind: paused, {names}, rate, due, claimed, running, dead in 24 h.")
    listing.add_argument("--json", action="store_true", help="Print a JSON list instead of a table.")
    pause = sub.add_parser("pause", help="Pause a kind: its due jobs stay pending until it is resumed.")
    pause.add_argument("kind", help="A registered kind, e.g. reminders.trial_ending.")
    resume = sub.add_parser("resume", help="Resume a paused kind: its due jobs are claimed again.")
    resume.add_argument("kind", help="A registered kind.")
    for option in kind_options.KIND_OPTIONS:
        setter = sub.add_parser(option.verb, help=f"{option.summary} 'none': {option.unset}.")
        setter.add_argument("kind", help="A registered kind.")
        setter.add_argument("value", help=f"{option.what.capitalize()}, or 'none'.")
    # a rate is N per period, optionally per payload field: not a scalar option, so its own verb
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
                option = kind_options.BY_VERB[verb]
                value = _value(option, options["value"])
                api.set_kind_option(kind, option.name, value)
                out.write(f"{kind}: {option.describe(value)}.")
    except exceptions.UnknownJobKind as exc:
        raise CommandError(f"{exc} `manage.py timekeeper kinds list` shows the registered kinds.") from exc
    except exceptions.SchedulingError as exc:
        raise CommandError(str(exc)) from exc


def _value(option: kind_options.KindOption, text: str) -> Any:
    try:
        return option.parse(text)
    except ValueError:
        raise CommandError(f"The {option.noun} must be {option.what}, or 'none'; got {text!r}.") from None


def _list(out: Any, as_json: bool) -> None:
    kinds = api.kind_overview()
    if as_json:
        out.write(json.dumps([k.as_json() for k in kinds], indent=2))
        return
    options = (o.noun for o in kind_options.KIND_OPTIONS)
    header = ("kind", "paused", *options, "rate", "due", "claimed", "running", "dead 24h")
    rows = [
        (
            k.kind,
            "yes" if k.paused else "no",
            *(option.show(value) for option, value in k.option_values),
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
