"""The JSON API's per-owner rate bucket (shared by every web process) and the prioritize_job permission."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0010_scheduledjob_run_alone_and_pending_kind_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiRateBucket",
            fields=[
                (
                    "owner",
                    models.OneToOneField(
                        help_text="The user whose creations are counted.",
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
                (
                    "full_at",
                    models.DateTimeField(
                        help_text="When the owner's burst allowance is whole again (database clock).",
                        verbose_name="full at",
                    ),
                ),
            ],
            options={
                "verbose_name": "API rate bucket",
            },
        ),
        migrations.AlterModelOptions(
            name="scheduledjob",
            options={
                "ordering": ["due_at", "id"],
                "permissions": [("prioritize_job", "Can schedule jobs through the API above a kind's caller priority")],
                "verbose_name": "scheduled job",
            },
        ),
    ]
