"""A deleted owner's jobs keep who owned them (``former_owner``); the counter table counts refused messages.

``former_owner`` is written when the user is deleted (``scheduling.api.retire_owner``): the owner foreign key
is then set to NULL, and without it the history would read as the system's own jobs. Existing rows
get '' (a column default in the database too, so inserts that do not name it need no change).
The outcome counter's help texts name the new ``refused_messages`` metric; no data changes.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0017_scheduledjob_add_per_call_overrides"),
    ]

    operations = [
        migrations.AddField(
            model_name="scheduledjob",
            name="former_owner",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The deleted user this job belonged to (username and id); empty while the owner exists and for the system's jobs.",
                max_length=200,
                verbose_name="former owner",
            ),
        ),
        migrations.AlterField(
            model_name="outcomecounter",
            name="label",
            field=models.CharField(
                help_text="The job's kind, the fixed-time schedule's name, or the refused task's name.",
                max_length=200,
                verbose_name="label",
            ),
        ),
        migrations.AlterField(
            model_name="outcomecounter",
            name="metric",
            field=models.CharField(
                help_text="job_attempts, jobs_finished, job_retries, jobs_reclaimed, fixed_runs or refused_messages.",
                max_length=32,
                verbose_name="metric",
            ),
        ),
    ]
