"""``manage.py timekeeper``: Timekeeper's one command, a subcommand per thing it operates.

Subcommands: ``jobs`` (list, with filters), ``cancel ID...`` (pending jobs), ``abort ID...`` (claimed
or running jobs: stopped and cancelled), ``retry ID...`` (dead jobs), ``reschedule ID... --at ISO |
--in SECONDS`` (pending jobs), ``kinds list|pause|resume|cap``
(``kinds_cli``), ``schedules`` and ``sync`` (fixed-time schedules: list them, write the declared ones;
``schedules_cli``), ``status`` (``status_cli``), ``recurrences ...`` (``recurrences_cli``) and
``probe worker|beat`` (a liveness probe: exit 0 while the pod's loop turns, 1 when it does not; no
database needed). Job changes go through the same bulk calls as the admin's actions (one statement
each): only jobs in the state the change is for are touched; the others are listed with the state
that kept them out. A change that touches no job at all is an error (exit status 1), so a script
notices. The old command names (``scheduling_status``, ``sync_schedules``, ``timekeeper_kinds``) are
aliases (``scheduling.management.aliases``) that say so and run the same code.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError, OperationalError, ProgrammingError
from django.db.models.functions import Now
from django.utils import timezone

from scheduling import api, exceptions
from scheduling.core import audit, liveness, validation
from scheduling.management import kinds_cli, recurrences_cli, schedules_cli, status_cli
from scheduling.models import JobState, ScheduledJob

DEFAULT_LIMIT = 50  # jobs listed unless --limit says otherwise
ERROR_SHOWN_CHARACTERS = 60  # of a job's last error in the text listing


MISSING_OBJECT_SQLSTATES = frozenset({"42P01", "42703"})  # undefined table, undefined column


def database_error_message(exc: DatabaseError) -> str:
    """What the command says for a database error other than an unreachable database.

    The error's class and first line; a missing table or column (a ``ProgrammingError``, e.g.
    ``timekeeper sync`` before ``migrate``) also says how to create it, after naming the database.
    """
    lines = str(exc).strip().splitlines()
    message = f"Database error ({type(exc).__name__}) in the {status_cli.describe_database()}: "
    message += lines[0] if lines else "no detail"
    if isinstance(exc, ProgrammingError):
        sqlstate = getattr(exc.__cause__, "sqlstate", None) or getattr(exc.__cause__, "pgcode", None)
        if sqlstate in MISSING_OBJECT_SQLSTATES:
            message += (
                ". Has the schema been created there? If this is the database you meant, run `manage.py migrate`; "
                "if not, set DATABASE_URL (`python3 dev.py manage ...` uses the servers `dev.py run` chose)."
            )
    return message


def job_id(text: str) -> int:
    """A positive job id (argparse reports a bad one as a usage error, exit status 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a job id: give whole numbers, as listed by `timekeeper jobs`."
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a job id: ids are positive.")
    if value > validation.MAX_ROW_ID:
        raise argparse.ArgumentTypeError(f"{value} is not a job id: ids are at most {validation.MAX_ROW_ID}.")
    return value


def positive_int(text: str) -> int:
    """A positive whole number, for argparse."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number.") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive.")
    if value > validation.MAX_ROW_ID:  # PostgreSQL's LIMIT takes a bigint
        raise argparse.ArgumentTypeError(f"{value} is too large: at most {validation.MAX_ROW_ID}.")
    return value


def parse_when(text: str) -> dt.datetime:
    """An ISO 8601 time; without an offset it is read in the project's TIME_ZONE."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time: write e.g. 2030-01-31T09:00:00+00:00 (or ...Z)."
        ) from None
    if timezone.is_naive(value):
        zone = timezone.get_current_timezone()
        # A wall time the clocks skip (spring) or repeat (autumn) has two offsets, one per fold; make_aware
        # would pick one without a word.
        if zone.utcoffset(value.replace(fold=0)) != zone.utcoffset(value.replace(fold=1)):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a single moment in {timezone.get_current_timezone_name()}: the clocks skip or "
                "repeat that wall time there. Give an offset (+01:00)."
            )
        value = timezone.make_aware(value)
    return value


def parse_seconds(text: str) -> float:
    """A non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds.") from None
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text} must be zero or more seconds.")
    return value


class Command(BaseCommand):
    help = (
        "Operate Timekeeper from a shell: list jobs (jobs), cancel pending ones (cancel), stop running ones "
        "(abort), retry dead ones (retry), move pending ones (reschedule), pause, resume or cap job kinds (kinds), "
        "list the fixed-time schedules (schedules) and write the declared ones (sync), "
        "show the backlog and broker counts (status), "
        "list and change recurrences (recurrences), probe a worker's or beat's liveness (probe). "
        "Run `manage.py timekeeper <subcommand> --help` for each one's options."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="subcommand", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")

        jobs = commands.add_parser("jobs", help="List jobs, most urgent first (by due time, then id).")
        jobs.add_argument(
            "--state",
            choices=JobState.values,
            help="Only jobs in this state (pending, claimed, done, cancelled, dead).",
        )
        jobs.add_argument(
            "--kind", help="Only jobs of this kind (the handler's registered name, e.g. billing.invoice)."
        )
        jobs.add_argument("--key", help="Only the jobs with this key (as given to api.schedule(key=...)).")
        jobs.add_argument(
            "--overdue", action="store_true", help="Only pending jobs whose due time has passed (the backlog)."
        )
        jobs.add_argument(
            "--limit",
            type=positive_int,
            default=DEFAULT_LIMIT,
            help=f"List at most this many (default {DEFAULT_LIMIT}).",
        )
        jobs.add_argument("--json", action="store_true", help="Print one JSON list of objects instead of a table.")

        cancel = commands.add_parser("cancel", help="Cancel pending jobs (claimed or finished ones are left alone).")
        cancel.add_argument("ids", nargs="+", type=job_id, metavar="ID", help="Ids of the jobs to cancel.")

        abort = commands.add_parser(
            "abort",
            help="Abort claimed or running jobs: a running handler is interrupted within about one heartbeat "
            "interval, its atomic writes rolled back, and the job cancelled; finished ones are left alone.",
        )
        abort.add_argument("ids", nargs="+", type=job_id, metavar="ID", help="Ids of the jobs to abort.")

        retry = commands.add_parser("retry", help="Make dead jobs pending again, due now, with fresh attempts.")
        retry.add_argument("ids", nargs="+", type=job_id, metavar="ID", help="Ids of the dead jobs to retry.")

        reschedule = commands.add_parser("reschedule", help="Move pending jobs to another due time.")
        reschedule.add_argument("ids", nargs="+", type=job_id, metavar="ID", help="Ids of the pending jobs to move.")
        when = reschedule.add_mutually_exclusive_group(required=True)
        when.add_argument(
            "--at",
            type=parse_when,
            help="The new due time, ISO 8601 (2030-01-31T09:00:00+00:00); without an offset, in TIME_ZONE.",
        )
        when.add_argument(
            "--in", dest="in_seconds", type=parse_seconds, help="The new due time as seconds from now (0: due now)."
        )

        for name, short, long, adder in (
            ("kinds", "Pause, resume or cap job kinds, or list them.", kinds_cli.HELP, kinds_cli.add_arguments),
            (
                "schedules",
                "List the fixed-time schedules and their next runs.",
                schedules_cli.SCHEDULES_HELP,
                schedules_cli.add_schedules_arguments,
            ),
            (
                "sync",
                "Write the fixed-time schedules declared in code (at every deploy).",
                schedules_cli.SYNC_HELP,
                schedules_cli.add_sync_arguments,
            ),
            (
                "status",
                "The due_at backlog, claimed and stuck jobs, and broker counts.",
                status_cli.HELP,
                status_cli.add_arguments,
            ),
        ):
            adder(commands.add_parser(name, help=short, description=long))
        recurrences_cli.add_parser(commands)

        probe = commands.add_parser(
            "probe",
            help="Liveness of this pod's worker or beat (exit 0: its loop turns; 1: it does not). Reads no database.",
        )
        probe.add_argument(
            "role", choices=liveness.ROLES, help="worker: the control loop's watcher file; beat: the scheduler's."
        )
        probe.add_argument(
            "--max-age",
            type=parse_seconds,
            default=None,
            help="Seconds the loop's file may be old (default SCHEDULING_LIVENESS_MAX_AGE_SECONDS).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = options["subcommand"]
        if subcommand == "probe":
            self.probe(options)
            return
        try:
            with audit.acting(audit.cli_actor()):  # the changes below are recorded as cli:<OS user>'s
                if subcommand == "jobs":
                    self.list_jobs(options)
                elif subcommand in ("cancel", "abort", "retry", "reschedule"):
                    self.change(subcommand, options)
                else:
                    RUNNERS[subcommand](self, options)
        except (OperationalError, InterfaceError) as exc:
            raise CommandError(
                f"Cannot reach the {status_cli.describe_database()}: {exc}. Is PostgreSQL up and DATABASE_URL right?"
            ) from exc
        except DatabaseError as exc:
            raise CommandError(database_error_message(exc)) from exc
        except exceptions.SchedulingError as exc:
            raise CommandError(str(exc)) from exc

    # --- probe ------------------------------------------------------------------------------------

    def probe(self, options: dict[str, Any]) -> None:
        """Exit 0 when the role's loop turned recently (a line on stdout), else CommandError (exit 1)."""
        verdict = liveness.check(options["role"], options["max_age"])
        if not verdict.alive:
            raise CommandError(f"not alive: {verdict.reason}")
        self.stdout.write(f"alive: {verdict.reason}")

    # --- jobs -------------------------------------------------------------------------------------

    def list_jobs(self, options: dict[str, Any]) -> None:
        jobs = ScheduledJob.objects.all()
        if options["state"]:
            jobs = jobs.in_states([options["state"]])
        if options["kind"]:
            jobs = jobs.filter(kind=options["kind"])
        if options["key"]:
            jobs = jobs.filter(key=options["key"])
        if options["overdue"]:
            jobs = jobs.filter(state=JobState.PENDING, due_at__lte=Now())
        rows = list(
            jobs.order_by("due_at", "id").values(
                "id", "kind", "state", "due_at", "attempts", "max_attempts", "key", "last_error"
            )[: options["limit"]]
        )
        if options["json"]:
            self.stdout.write(json.dumps(rows, default=_json_default, sort_keys=True))
            return
        if not rows:
            self.stdout.write("No job matches.")
            return
        header = f"{'id':>8}  {'state':<9}  {'due at (UTC)':<20}  {'tries':>5}  {'kind':<28}  key / last error"
        self.stdout.write(header)
        for row in rows:
            due = row["due_at"].astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            tries = f"{row['attempts']}/{row['max_attempts']}"
            tail = row["key"] or ""
            if row["last_error"]:
                tail = f"{tail}  {row['last_error'].splitlines()[0][:ERROR_SHOWN_CHARACTERS]}".strip()
            self.stdout.write(f"{row['id']:>8}  {row['state']:<9}  {due:<20}  {tries:>5}  {row['kind']:<28}  {tail}")

    # --- changes ----------------------------------------------------------------------------------

    def change(self, subcommand: str, options: dict[str, Any]) -> None:
        ids = options["ids"]
        wanted: str
        if subcommand == "cancel":
            result, done, wanted = api.cancel_many(ids), "cancelled", JobState.PENDING
        elif subcommand == "abort":
            result, done, wanted = api.abort_many(ids), "aborted", "claimed or running"
        elif subcommand == "retry":
            result, done, wanted = api.retry_dead_many(ids), "retried", JobState.DEAD
        else:
            if options["at"] is not None:
                result = api.reschedule_many(ids, due_at=options["at"])
            else:
                result = api.reschedule_many(ids, delay=options["in_seconds"])
            done, wanted = "rescheduled", JobState.PENDING
        if result.changed:
            self.stdout.write(f"{done.capitalize()} {_count(len(result.changed))}: {_ids(result.changed)}.")
        for state in sorted(set(result.untouched.values())):
            left = sorted(i for i, s in result.untouched.items() if s == state)
            self.stderr.write(f"Not {done} ({state}, not {wanted}): {_ids(left)}.")
        if result.missing:
            self.stderr.write(f"No such job: {_ids(result.missing)}.")
        if not result.changed:
            raise CommandError(
                f"No job was {done}: only {wanted} jobs can be. "
                f"List them with `manage.py timekeeper jobs --state {'running' if subcommand == 'abort' else wanted}`."
            )


# The subcommands in the order `--help` lists them; those not in RUNNERS are methods of Command.
SUBCOMMANDS = (
    "jobs",
    "cancel",
    "abort",
    "retry",
    "reschedule",
    "kinds",
    "schedules",
    "sync",
    "status",
    "recurrences",
    "probe",
)
RUNNERS: dict[str, Callable[[BaseCommand, dict[str, Any]], None]] = {
    "kinds": kinds_cli.run,
    "schedules": schedules_cli.run_schedules,
    "sync": schedules_cli.run_sync,
    "status": status_cli.run,
    "recurrences": recurrences_cli.run,
}


def _json_default(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _count(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _ids(ids: Any) -> str:
    return ", ".join(str(i) for i in ids)
