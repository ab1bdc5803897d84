"""Handler-chosen outcomes (registry.Snooze, RetryAfter, Discard, Cancel): four attempt outcomes, counted.

A fixed-time run a handler discards or cancels ends ``discarded`` / ``cancelled`` (two run states).

The attempts-counting trigger (0015, 0022) counts every attempt by its outcome (``job_attempts``);
here a handler's ``RetryAfter`` that leaves its job pending is a retry (``job_retries``), as a
failure is, and a job its handler cancelled is finished (``jobs_finished{outcome="cancelled"}``).
A snooze is neither: an attempt recorded, not charged, the job pending again.
"""

from django.db import migrations, models

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
    ]
