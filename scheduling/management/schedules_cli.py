"""``manage.py timekeeper sync`` and ``timekeeper schedules``: the fixed-time schedules declared in code.

``sync`` writes the declarations (``declarations.declare`` in the handler packages) into
django-celery-beat's tables and the policies; ``schedules`` lists what the database holds, with the
next runs in each schedule's zone. Both read and write through ``scheduling.fixed``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from scheduling.core import exceptions
from scheduling.fixed import declarations, policies
from scheduling.models import SchedulePolicy

SYNC_HELP = (
    "Create or update the fixed-time schedules declared in code (declarations.declare in the handler "
    "packages): their crontab (with its time zone) or interval, periodic task and policy. Idempotent: "
    "a schedule that already matches its declaration is not written. Run at every deploy."
)
SCHEDULES_HELP = (
    "List the fixed-time schedules in the database: name, kind, timing, whether enabled, and the next runs "
    "in the schedule's zone. `timekeeper sync` writes them from the declarations in code."
)
DEFAULT_NEXT = 1  # next runs shown per schedule unless --next says otherwise
MAX_NEXT = 20
SYNC_REFUSALS = (
    exceptions.InvalidCronExpression,
    exceptions.UnknownTimeZone,
    exceptions.InvalidSchedule,
    exceptions.InvalidPolicy,
    exceptions.InvalidPayload,
    exceptions.UnknownJobKind,
)


def add_sync_arguments(parser: CommandParser) -> None:
    """The arguments of ``timekeeper sync`` (and of its old name, ``sync_schedules``)."""
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="Only sync these declared schedules (default: all of them)."
    )
    parser.add_argument(
        "--disable-undeclared",
        action="store_true",
        help="Also disable fixed-time periodic tasks that no declaration names any more (history is kept).",
    )


def add_schedules_arguments(parser: CommandParser) -> None:
    """The arguments of ``timekeeper schedules``."""
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="Only these schedules (default: every fixed-time schedule)."
    )
    parser.add_argument(
        "--next",
        type=int,
        default=DEFAULT_NEXT,
        help=f"How many next runs to show per schedule (0 to {MAX_NEXT}, default {DEFAULT_NEXT}).",
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON list of objects instead of a table.")


def run_sync(command: Any, options: dict[str, Any]) -> None:
    """Sync the declarations; an invalid one is a CommandError and nothing is written."""
    try:
        report = declarations.sync(options["names"] or None, disable_undeclared=options["disable_undeclared"])
    except SYNC_REFUSALS as exc:
        raise CommandError(f"{exc} Fix the declaration (declarations.declare in tasks/) and run again.") from exc
    for label, names in (
        ("created", report.created),
        ("updated", report.updated),
        ("unchanged", report.unchanged),
        ("disabled", report.disabled),
    ):
        if names:
            command.stdout.write(f"{label}: {', '.join(names)}")
    total = len(report.created) + len(report.updated) + len(report.unchanged)
    command.stdout.write(command.style.SUCCESS(f"{total} schedule(s) in sync."))


def run_schedules(command: Any, options: dict[str, Any]) -> None:
    """List the fixed-time schedules (unknown names are a CommandError)."""
    if not 0 <= options["next"] <= MAX_NEXT:
        raise CommandError(f"--next must be from 0 to {MAX_NEXT}; got {options['next']}.")
    rows = SchedulePolicy.objects.select_related(
        "periodic_task", "periodic_task__crontab", "periodic_task__interval"
    ).order_by("periodic_task__name")
    names = options["names"]
    if names:
        rows = rows.filter(periodic_task__name__in=names)
    listing = [_row(policy, options["next"]) for policy in rows]
    missing = sorted(set(names) - {row["name"] for row in listing})
    if missing:
        raise CommandError(
            f"No fixed-time schedule is named {', '.join(missing)}. "
            "`manage.py timekeeper schedules` lists them; `timekeeper sync` writes the declared ones."
        )
    if options["json"]:
        command.stdout.write(json.dumps(listing, sort_keys=True))
        return
    if not listing:
        command.stdout.write("No fixed-time schedule (declare them in code, then `manage.py timekeeper sync`).")
        return
    command.stdout.write(f"{'name':<28}  {'kind':<28}  {'enabled':<7}  {'policy':<7}  {'next run':<25}  timing")
    for row in listing:
        following = row["next_runs"][0] if row["next_runs"] else "-"
        command.stdout.write(
            f"{row['name']:<28}  {row['kind']:<28}  {'yes' if row['enabled'] else 'no':<7}  "
            f"{row['concurrency_policy']:<7}  {following:<25}  {row['timing']}"
        )


def _row(policy: SchedulePolicy, n: int) -> dict[str, Any]:
    task = policy.periodic_task
    try:
        upcoming: list[dt.datetime] = policies.preview(policy, n) if task.enabled and n else []
    except exceptions.SchedulingError:
        upcoming = []  # the timing is invalid: `timing` says why
    return {
        "name": task.name,
        "kind": policy.kind,
        "enabled": task.enabled,
        "concurrency_policy": policy.concurrency_policy,
        "timing": policies.describe(policy),
        "next_runs": [instant.isoformat() for instant in upcoming],
    }
