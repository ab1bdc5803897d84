"""``manage.py scheduling_status``: the due_at backlog and the broker's visible and delayed counts."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from scheduling import api

TABLE_ROWS = (
    ("backlog", "backlog (pending and due)", ""),
    ("paused", "paused (due, kind paused)", ""),
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


class Command(BaseCommand):
    help = (
        "Show what is waiting: the due_at table's backlog, oldest overdue job, claimed and stuck jobs, and the "
        "broker's visible and delayed (countdown) messages. Broker counts are a snapshot, exact to within the "
        "messages that move while they are read."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="Print one JSON object (the output of scheduling.api.status())."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            status = api.status()
        except DatabaseError as exc:
            raise CommandError(f"Cannot read the job table: {exc}. Is PostgreSQL up and DATABASE_URL right?") from exc
        if options["json"]:
            self.stdout.write(json.dumps(status, sort_keys=True))
            return
        self.stdout.write(self.render(status))

    def render(self, status: dict[str, Any]) -> str:
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
