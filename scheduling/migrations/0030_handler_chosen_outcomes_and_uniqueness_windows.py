"""Handler-chosen outcomes (registry.Snooze, RetryAfter, Discard, Cancel): four attempt outcomes, counted.

A fixed-time run a handler discards or cancels ends ``discarded`` / ``cancelled`` (two run states).

The attempts-counting trigger (0015, 0022) counts every attempt by its outcome (``job_attempts``);
here a handler's ``RetryAfter`` that leaves its job pending is a retry (``job_retries``), as a
failure is, and a job its handler cancelled is finished (``jobs_finished{outcome="cancelled"}``).
A snooze is neither: an attempt recorded, not charged, the job pending again.

Uniqueness windows (``schedule(unique_for=...)``): two nullable columns (instant) and the unique
index that enforces them, over the rows whose state is one of their own ``unique_states`` (River's
unique_key and unique_states). Its predicate compares two columns, which Django's constraints
cannot say, so it is raw SQL; built ``CONCURRENTLY`` (writes do not wait) over no rows at first.
"""

import django.contrib.postgres.fields
from django.db import migrations, models

UNIQUE_WINDOW_INDEX = """
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS scheduledjob_unique_window_uniq ON scheduling_scheduledjob (unique_key)
WHERE unique_key IS NOT NULL AND state = ANY(unique_states)
"""
DROP_UNIQUE_WINDOW_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS scheduledjob_unique_window_uniq"

COUNTS_HANDLER_CHOICES = """
CREATE OR REPLACE FUNCTION scheduling_count_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scheduling_outcomecounter AS c (metric, label, outcome, value)
    SELECT m.metric, j.kind, m.outcome, count(*)
    FROM new_attempts AS a
    JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
    CROSS JOIN LATERAL (VALUES
        ('job_attempts', a.outcome, true),
        ('jobs_finished', j.state, (j.state IN ('done', 'dead') OR (j.state = 'cancelled' AND a.outcome = 'cancelled'))
                                   AND a.number = j.attempts),
        ('job_retries', '', a.outcome IN ('failed', 'timed_out', 'retry_after') AND j.state = 'pending'),
        ('jobs_reclaimed', '', a.outcome = 'reclaimed')
    ) AS m(metric, outcome, counted)
    WHERE m.counted
    GROUP BY m.metric, j.kind, m.outcome
    ORDER BY m.metric, j.kind, m.outcome
    ON CONFLICT (metric, label, outcome) DO UPDATE SET value = c.value + EXCLUDED.value;
    RETURN NULL;
END $$;
"""

# 0022's function, for the way back.
BY_KEY = """
CREATE OR REPLACE FUNCTION scheduling_count_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scheduling_outcomecounter AS c (metric, label, outcome, value)
    SELECT m.metric, j.kind, m.outcome, count(*)
    FROM new_attempts AS a
    JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
    CROSS JOIN LATERAL (VALUES
        ('job_attempts', a.outcome, true),
        ('jobs_finished', j.state, j.state IN ('done', 'dead') AND a.number = j.attempts),
        ('job_retries', '', a.outcome IN ('failed', 'timed_out') AND j.state = 'pending'),
        ('jobs_reclaimed', '', a.outcome = 'reclaimed')
    ) AS m(metric, outcome, counted)
    WHERE m.counted
    GROUP BY m.metric, j.kind, m.outcome
    ORDER BY m.metric, j.kind, m.outcome
    ON CONFLICT (metric, label, outcome) DO UPDATE SET value = c.value + EXCLUDED.value;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("scheduling", "0028_list_an_owners_jobs_by_due_time"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobattempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("timed_out", "timed out"),
                    ("reclaimed", "reclaimed"),
                    ("snoozed", "snoozed"),
                    ("retry_after", "retry after"),
                    ("discarded", "discarded"),
                    ("cancelled", "cancelled"),
                ],
                help_text="How it ended.",
                max_length=16,
                verbose_name="outcome",
            ),
        ),
        migrations.AlterField(
            model_name="schedulerun",
            name="state",
            field=models.CharField(
                choices=[
                    ("running", "running"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("skipped", "skipped (overlap)"),
                    ("missed", "missed (deadline)"),
                    ("replaced", "replaced"),
                    ("timed_out", "timed out"),
                    ("discarded", "discarded (by its handler)"),
                    ("cancelled", "cancelled (by its handler)"),
                ],
                help_text="How the run went.",
                max_length=16,
                verbose_name="state",
            ),
        ),
        migrations.RemoveConstraint(model_name="schedulerun", name="schedulerun_state_valid"),
        migrations.AddConstraint(
            model_name="schedulerun",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    state__in=[
                        "running",
                        "succeeded",
                        "failed",
                        "skipped",
                        "missed",
                        "replaced",
                        "timed_out",
                        "discarded",
                        "cancelled",
                    ]
                ),
                name="schedulerun_state_valid",
            ),
        ),
        migrations.RunSQL(COUNTS_HANDLER_CHOICES, BY_KEY),
        migrations.AddField(
            model_name="scheduledjob",
            name="unique_key",
            field=models.CharField(
                blank=True,
                help_text="What makes it unique within its window: a hash of kind, owner and key (or payload), and the slot.",
                max_length=100,
                null=True,
                verbose_name="unique key",
            ),
        ),
        migrations.AddField(
            model_name="scheduledjob",
            name="unique_states",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=16),
                blank=True,
                help_text="The states in which this job holds its unique key (a second job of the key is a conflict).",
                null=True,
                size=None,
                verbose_name="unique states",
            ),
        ),
        migrations.RunSQL(UNIQUE_WINDOW_INDEX, DROP_UNIQUE_WINDOW_INDEX),
    ]
