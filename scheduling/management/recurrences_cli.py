"""``manage.py timekeeper recurrences ...``: list, create, pause, resume, cancel recurrences and preview them.

The ``timekeeper`` command adds this as its ``recurrences`` subcommand; every change goes through
``scheduling.api`` and bad input is a ``CommandError`` a person can act on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from scheduling import api
from scheduling.core import validation
from scheduling.models import Recurrence, RecurrenceState

DEFAULT_LIMIT = 50


def _id(text: str) -> int:
    found = validation.row_id_text(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a recurrence id (a whole number from 1).")
    return found


def _limit(text: str) -> int:
    found = validation.row_id_text(text)  # 1 to bigint: PostgreSQL's LIMIT takes no more
    if found is None:
        raise argparse.ArgumentTypeError(f"--limit must be a positive whole number, not {text!r}.")
    return found


def _when(text: str) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 date-time.") from None
    if parsed.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset (write e.g. 2030-01-31T09:00:00+01:00).")
    return parsed


def add_parser(commands: Any) -> None:
    """Add ``recurrences`` and its actions to the ``timekeeper`` command's subparsers."""
    parser = commands.add_parser("recurrences", help="List, create, pause, resume or cancel recurrences.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="{list,create,pause,resume,cancel,next}")
    listing = actions.add_parser("list", help="List recurrences by id, with their latest occurrence.")
    listing.add_argument("--state", choices=RecurrenceState.values, help="Only recurrences in this state.")
    listing.add_argument("--kind", help="Only recurrences of this kind.")
    listing.add_argument("--owner", help="Only the recurrences of this username.")
    listing.add_argument("--timezone", help="Only recurrences on this zone (e.g. Europe/Lisbon).")
    listing.add_argument(
        "--limit", type=_limit, default=DEFAULT_LIMIT, help=f"At most this many (default {DEFAULT_LIMIT})."
    )
    listing.add_argument("--json", action="store_true", help="Print one JSON list instead of a table.")

    create = actions.add_parser("create", help="Create (or, with the key taken, change) a recurrence.")
    create.add_argument("kind", help="The registered kind each occurrence runs.")
    create.add_argument("--key", required=True, help="The recurrence's key, unique per owner (e.g. digest:42).")
    rule = create.add_mutually_exclusive_group(required=True)
    rule.add_argument("--cron", help="A cron expression or nickname on the zone's wall clock, e.g. '0 9 * * *'.")
    rule.add_argument("--every", type=float, help="An interval in seconds instead of a cron expression.")
    create.add_argument("--timezone", default="UTC", help="The zone of the expression (default UTC).")
    create.add_argument("--payload", default="{}", help="The payload of every occurrence, as JSON (default {}).")
    create.add_argument("--owner", help="The username the recurrence belongs to (default: the system's).")
    create.add_argument("--starts-at", type=_when, help="No occurrence before this ISO 8601 instant.")
    create.add_argument("--ends-at", type=_when, help="No occurrence after this ISO 8601 instant.")
    create.add_argument(
        "--dst-gap", choices=("shift", "skip"), default="shift", help="A skipped wall time: shift or skip."
    )
    create.add_argument("--missed", choices=("skip", "run_once"), default="skip", help="Missed occurrences policy.")

    for name, text in (("pause", "Pause"), ("resume", "Resume"), ("cancel", "Cancel")):
        verb = actions.add_parser(name, help=f"{text} recurrences by id.")
        verb.add_argument("ids", nargs="+", type=_id, metavar="ID", help=f"Ids of the recurrences to {name}.")

    preview = actions.add_parser("next", help="Show a recurrence's next occurrence instants.")
    preview.add_argument("id", type=_id, metavar="ID", help="The recurrence's id.")
    preview.add_argument("-n", type=_id, default=5, help="How many (1-100, default 5).")


def _owner(username: str | None) -> Any:
    if username is None:
        return None
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"No user is named {username!r}.")
    return user


def run(command: Any, options: dict[str, Any]) -> None:
    """Carry out ``timekeeper recurrences <action>`` (SchedulingError becomes a CommandError in the caller)."""
    action = options["action"]
    out = command.stdout
    if action == "list":
        rows = Recurrence.objects.all()
        for name in ("state", "kind", "timezone"):
            if options[name]:
                rows = rows.filter(**{name: options[name]})
        if options["owner"]:
            rows = rows.filter(owner=_owner(options["owner"]))
        values = list(
            rows.order_by("id").values(
                "id", "key", "kind", "state", "expression", "every_seconds", "timezone", "current_at"
            )[: options["limit"]]
        )
        if options["json"]:
            out.write(json.dumps(values, default=lambda v: v.isoformat(), sort_keys=True))
            return
        if not values:
            out.write("No recurrence matches.")
            return
        out.write(f"{'id':>8}  {'state':<9}  {'rule':<16}  {'zone':<20}  {'occurrence (UTC)':<20}  {'kind':<24}  key")
        for row in values:
            rule = row["expression"] or f"every {row['every_seconds']:g}s"
            at = row["current_at"].astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if row["current_at"] else "-"
            zone, kind = row["timezone"], row["kind"]
            out.write(f"{row['id']:>8}  {row['state']:<9}  {rule:<16}  {zone:<20}  {at:<20}  {kind:<24}  {row['key']}")
        return
    if action == "create":
        try:
            payload = json.loads(options["payload"])
        except ValueError as exc:
            raise CommandError(f"--payload is not JSON: {exc}.") from None
        recurrence = api.recur(
            options["kind"],
            payload,
            key=options["key"],
            cron=options["cron"],
            every=options["every"],
            timezone=options["timezone"],
            owner=_owner(options["owner"]),
            starts_at=options["starts_at"],
            ends_at=options["ends_at"],
            dst_gap=options["dst_gap"],
            missed=options["missed"],
        )
        first = recurrence.current_at.isoformat() if recurrence.current_at else "none (it has ended)"
        out.write(f"Recurrence {recurrence.id} ({recurrence.key}): next occurrence {first}.")
        return
    if action == "next":
        if not 1 <= options["n"] <= 100:
            raise CommandError("-n must be from 1 to 100.")
        for instant in api.next_occurrences(options["id"], n=options["n"]):
            out.write(instant.isoformat())
        return
    calls = {"pause": api.pause_recurrences, "resume": api.resume_recurrences, "cancel": api.cancel_recurrences}
    result = calls[action](options["ids"])
    done = {"pause": "Paused", "resume": "Resumed", "cancel": "Cancelled"}[action]
    if result.changed:
        out.write(f"{done} {len(result.changed)}: {', '.join(map(str, result.changed))}.")
    for rid, state in sorted(result.untouched.items()):
        command.stderr.write(f"Not changed: {rid} is {state}.")
    if result.missing:
        command.stderr.write(f"No such recurrence: {', '.join(map(str, result.missing))}.")
    if not result.changed:
        raise CommandError(f"No recurrence was changed by {action}.")
