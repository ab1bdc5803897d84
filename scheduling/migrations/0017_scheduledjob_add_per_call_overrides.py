"""Per-call overrides of a kind's contract on ScheduledJob: timeout, backoff (base, cap), atomic; empty is the kind's."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0016_recurrence_and_occurrences"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="scheduledjob",
            name="atomic",
            field=models.BooleanField(
                blank=True,
                help_text="Whether this job's writes commit with its outcome (yes) or as it goes (no); empty: its kind's.",
                null=True,
                verbose_name="atomic",
            ),
        ),
        migrations.AddField(
            model_name="scheduledjob",
            name="backoff_base_seconds",
            field=models.FloatField(
                blank=True,
                help_text="This job's backoff between failed attempts (first step), chosen when it was scheduled; empty: its kind's.",
                null=True,
                verbose_name="backoff base (seconds)",
            ),
        ),
        migrations.AddField(
            model_name="scheduledjob",
            name="backoff_cap_seconds",
            field=models.FloatField(
                blank=True,
                help_text="This job's longest wait between failed attempts; empty: its kind's.",
                null=True,
                verbose_name="backoff cap (seconds)",
            ),
        ),
        migrations.AddField(
            model_name="scheduledjob",
            name="timeout_seconds",
            field=models.FloatField(
                blank=True,
                help_text="This job's timeout, chosen when it was scheduled; empty: its kind's.",
                null=True,
                verbose_name="timeout (seconds)",
            ),
        ),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("timeout_seconds__isnull", True), ("timeout_seconds__gt", 0), _connector="OR"),
                    models.Q(
                        models.Q(("backoff_base_seconds__isnull", True), ("backoff_cap_seconds__isnull", True)),
                        models.Q(
                            ("backoff_base_seconds__gt", 0),
                            ("backoff_cap_seconds__gte", models.F("backoff_base_seconds")),
                        ),
                        _connector="OR",
                    ),
                ),
                name="scheduledjob_overrides_valid",
            ),
        ),
    ]
