"""Drop the owner foreign keys' own indexes: the (owner, state) indexes already lead with owner.

Django gives every foreign key an index; on the jobs and recurrences tables ``owner_id`` is also
the first column of ``scheduledjob_owner_state_idx`` and ``recurrence_owner_state_idx``, which serve
the same lookups (a user's jobs, the cascade when a user is deleted). Every job write (insert,
claim, start, finish: the state changes, so no update is HOT) and every recurrence advance paid
for the extra index. Only the indexes go: Django's own AlterField would also drop and re-add the
foreign key constraints, re-checking every row under a lock, so the database side is the two
``DROP INDEX`` statements and the model state follows with ``SeparateDatabaseAndState``.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0019_jobs_and_attempts_autovacuum_settings"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX IF EXISTS {name}",
                    reverse_sql=f"CREATE INDEX IF NOT EXISTS {name} ON {table} (owner_id)",
                )
                for table, name in (
                    ("scheduling_recurrence", "scheduling_recurrence_owner_id_e867d6fb"),
                    ("scheduling_scheduledjob", "scheduling_scheduledjob_owner_id_84d233e4"),
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="recurrence",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        help_text="The user the recurrence belongs to; others cannot see it through the API.",
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="recurrences",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
                migrations.AlterField(
                    model_name="scheduledjob",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        help_text="The user the job belongs to; others cannot see it through the API.",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="scheduled_jobs",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="owner",
                    ),
                ),
            ],
        ),
    ]
