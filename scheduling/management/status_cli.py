"""``manage.py timekeeper status``: the due_at backlog and the broker's visible and delayed counts."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser
from django.db import connection

from scheduling import api

HELP = (
    "Show what is waiting: the due_at table's backlog, oldest overdue job, claimed and stuck jobs, and the "
    "broker's visible and delayed (countdown) messages. Broker counts are a snapshot, exact to within the "
    "messages that move while they are read."
)
TABLE_ROWS = (
    ("backlog", "backlog (pending and due)", ""),
    ("paused", "paused (due, kind paused)", ""),
    ("rate_limited", "rate-limited (due, kind has a rate)", ""),
    ("oldest_overdue_seconds", "oldest overdue", "s"),
    ("pending", "pending (all)", ""),
    ("due_next_24h", "due in the next 24 h", ""),
    ("claimed", "claimed (running)", ""),
    ("stuck", "stuck claims", ""),
    ("dead_last_24h", "dead in the last 24 h", ""),
)
BROKER_ROWS = (
    ("visible", "visible (due, waiting for a worker)"),
    ("delayed", "delayed (countdown not yet due)"),
    ("delayed_held", "  held by workers"),
    ("delayed_queued", "  still in the queues (workers at their ETA limit)"),
    ("in_flight", "in flight (taken, due)"),
    ("unacked", "unacknowledged (held + in flight)"),
)


def add_arguments(parser: CommandParser) -> None:
    """The arguments of ``timekeeper status`` (and of its old name, ``scheduling_status``)."""
    parser.add_argument(
        "--json", action="store_true", help="Print one JSON object (the output of scheduling.api.status())."
    )


def describe_database() -> str:
    """Which database the command talks to, without the password: ``database 'x' on host:port as user``.

    Said first, so a person who reached another database than they meant (a second terminal without
    the run command's ``DATABASE_URL``) sees it before any advice to migrate.
    """
    settings = connection.settings_dict
    host = str(settings.get("HOST") or "")
    where = f"the socket in {host}" if host.startswith("/") else host or "the local socket"
    port = f":{settings['PORT']}" if settings.get("PORT") and not host.startswith("/") else ""
    user = f" as {settings['USER']}" if settings.get("USER") else ""
    return f"database {settings.get('NAME')!r} on {where}{port}{user}"


def run(command: Any, options: dict[str, Any]) -> None:
    """Print the status (a DatabaseError becomes a CommandError in the caller); the text form names the database."""
    if not options["json"]:
        command.stdout.write(describe_database())
    status = api.status()
    if options["json"]:
        command.stdout.write(json.dumps(status, sort_keys=True))
    else:
        command.stdout.write(render(status))


def render(status: dict[str, Any]) -> str:
    """The status as an aligned two-column text table."""
    lines = ["due_at table"]
    for name, label, unit in TABLE_ROWS:
        value = status.get(name)
        text = "-" if value is None else (f"{value:.1f}" if isinstance(value, float) else str(value))
        lines.append(f"  {label:<52} {text}{unit}")
    broker = status.get("broker")
    lines.append("broker (Redis)")
    if broker is None:
        lines.append("  unavailable: Redis did not answer (Celery's broker_url)")
    else:
        for name, label in BROKER_ROWS:
            lines.append(f"  {label:<52} {broker.get(name, '-')}")
        if not broker.get("exact", True):
            lines.append("  (queues too long to read whole: some counts are estimated)")
    return "\n".join(lines)
