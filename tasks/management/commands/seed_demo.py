"""Load the demo data the run command shows: fixed schedules, a trial with its reminder, sample jobs."""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from scheduling import api, exceptions
from scheduling.core import store
from scheduling.models import ScheduledJob
from tasks.models import Trial

DEMO_USER = "demo"


class Command(BaseCommand):
    help = (
        "Load Timekeeper's demo data: sync the fixed-time schedules declared in tasks/, start a trial "
        "for the demo user (its ending reminder is a due_at job), and schedule a few sample jobs "
        "(one due soon, one failing to show retries, one far ahead). Loads them once: a second run adds nothing, "
        "even after the first jobs have run (a demo job whose key was ever used is not scheduled again)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--owner",
            default="demo-customer",
            help="Username that owns the demo trial and jobs (created as a customer that cannot log in, if missing; "
            "never a staff account, so `createsuperuser` stays free for any name). Default: demo-customer.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        owner_name = options["owner"]
        if not owner_name or len(owner_name) > 150:  # checked before anything is written
            raise CommandError("--owner must be a username of 1 to 150 characters.")
        call_command("timekeeper", "sync", verbosity=options["verbosity"])
        owner, created = get_user_model().objects.get_or_create(username=owner_name)
        if created:
            owner.set_unusable_password()
            owner.save(update_fields=["password"])
        now = store.database_now()
        with transaction.atomic():
            # Any trial of the owner's, upgraded or not: the demo trial is created once.
            trial = Trial.objects.filter(user=owner).order_by("pk").first()
            if trial is None:
                trial = Trial.objects.create(user=owner, plan="pro", ends_at=now + dt.timedelta(days=14))
            jobs: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
                (
                    "reminders.trial_ending",
                    {"user_id": owner.pk, "trial_id": trial.pk},
                    {"due_at": trial.ends_at - dt.timedelta(days=3)},
                    trial.reminder_key,
                ),
                ("demo.record", {"label": "due in a minute"}, {"delay": 60}, "demo:soon"),
                ("demo.fail", {}, {"delay": 30}, "demo:failing"),
                ("demo.record", {"label": "next week"}, {"delay": 7 * 86_400}, "demo:next-week"),
            ]
            added = 0
            try:
                for kind, payload, when, key in jobs:
                    # A key seen in any state (done, dead, cancelled too) was seeded before: the demo
                    # is loaded once, not topped up each time the run command starts.
                    if ScheduledJob.objects.filter(key=key).exists():
                        continue
                    api.schedule(kind, payload, key=key, on_conflict="keep", owner=owner, **when)
                    added += 1
            except exceptions.SchedulingError as exc:
                raise CommandError(f"Could not schedule the demo jobs: {exc}") from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo data for {owner_name}: trial {trial.pk}; {added} demo job(s) added, "
                f"{len(jobs) - added} already loaded."
            )
        )
