"""Crash isolation and caps that never starve other kinds.

``run_alone``: a job whose batch died with its process is sent alone from then on (the sweeper sets
it), so the next crash is charged to the job that causes it, not to its siblings.
``scheduledjob_pending_kind_idx``: a capped kind's claim reads its room of rows, most urgent first,
from its own range of pending rows, however many of it (or of others) are due.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0009_scheduledjob_key_unique_among_waiting_jobs"),
    ]

    operations = [
        migrations.AddField(
            model_name="scheduledjob",
            name="run_alone",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Set when the job's batch died with its process: from then on it is sent in a batch of its own, so a crash is charged to the job that causes it.",
                verbose_name="run alone",
            ),
        ),
        migrations.AddIndex(
            model_name="scheduledjob",
            index=models.Index(
                condition=models.Q(("state", "pending")),
                fields=["kind", "-priority", "due_at"],
                name="scheduledjob_pending_kind_idx",
            ),
        ),
    ]
