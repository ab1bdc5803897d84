"""Counters that survive pruning: ``scheduling_outcomecounter`` and the triggers that keep it.

Statement-level AFTER triggers with transition tables, so the statements that record outcomes
(``complete_jobs``, ``fail_jobs``, ``release_jobs``, ``sweep_expired_claims``, the fixed-time
run's insert and finish) stay as they are and the count is in their transaction:

- on ``scheduling_jobattempt`` INSERT: per (kind, outcome) of the statement's new attempts, one
  upsert each: ``job_attempts`` (every attempt), ``jobs_finished`` (the job is now done or dead),
  ``job_retries`` (failed or timed out, pending again), ``jobs_reclaimed`` (taken back).
- on ``scheduling_schedulerun`` INSERT (rows born final: missed, skipped) and UPDATE (running to a
  final state): ``fixed_runs`` per (schedule name, state).

Aggregated per statement, not per row: a batch of 50 completions is one upsert per
(metric, kind, outcome), in a fixed order (metric, label, outcome) so two transactions lock the
counter rows in the same order. A counter row stays locked until its transaction commits; the
batch's outcomes are written at the end of its transaction, so the wait is a commit at most.
Deletes (the pruner) have no trigger: counts never go down.
"""

from django.db import migrations, models

ATTEMPTS_FUNCTION = """
CREATE FUNCTION scheduling_count_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scheduling_outcomecounter AS c (metric, label, outcome, value)
    SELECT metric, label, outcome, sum(n)
    FROM (
        SELECT 'job_attempts' AS metric, j.kind AS label, a.outcome AS outcome, 1 AS n
        FROM new_attempts AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
        UNION ALL
        SELECT 'jobs_finished', j.kind, j.state, 1
        FROM new_attempts AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
        WHERE j.state IN ('done', 'dead') AND a.number = j.attempts
        UNION ALL
        SELECT 'job_retries', j.kind, '', 1
        FROM new_attempts AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
        WHERE a.outcome IN ('failed', 'timed_out') AND j.state = 'pending'
        UNION ALL
        SELECT 'jobs_reclaimed', j.kind, '', 1
        FROM new_attempts AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
        WHERE a.outcome = 'reclaimed'
    ) AS counted
    GROUP BY metric, label, outcome
    ORDER BY metric, label, outcome
    ON CONFLICT (metric, label, outcome) DO UPDATE SET value = c.value + EXCLUDED.value;
    RETURN NULL;
END $$;
"""

RUNS_FUNCTION = """
CREATE FUNCTION scheduling_count_fixed_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO scheduling_outcomecounter AS c (metric, label, outcome, value)
        SELECT 'fixed_runs', t.name, r.state, count(*)
        FROM new_runs AS r
        JOIN scheduling_schedulepolicy AS p ON p.id = r.schedule_id
        JOIN django_celery_beat_periodictask AS t ON t.id = p.periodic_task_id
        WHERE r.state <> 'running'
        GROUP BY t.name, r.state
        ORDER BY t.name, r.state
        ON CONFLICT (metric, label, outcome) DO UPDATE SET value = c.value + EXCLUDED.value;
    ELSE
        INSERT INTO scheduling_outcomecounter AS c (metric, label, outcome, value)
        SELECT 'fixed_runs', t.name, r.state, count(*)
        FROM new_runs AS r
        JOIN old_runs AS o ON o.id = r.id
        JOIN scheduling_schedulepolicy AS p ON p.id = r.schedule_id
        JOIN django_celery_beat_periodictask AS t ON t.id = p.periodic_task_id
        WHERE o.state = 'running' AND r.state <> 'running'
        GROUP BY t.name, r.state
        ORDER BY t.name, r.state
        ON CONFLICT (metric, label, outcome) DO UPDATE SET value = c.value + EXCLUDED.value;
    END IF;
    RETURN NULL;
END $$;
"""

TRIGGERS = """
CREATE TRIGGER scheduling_jobattempt_count AFTER INSERT ON scheduling_jobattempt
    REFERENCING NEW TABLE AS new_attempts FOR EACH STATEMENT EXECUTE FUNCTION scheduling_count_attempts();
CREATE TRIGGER scheduling_schedulerun_count_insert AFTER INSERT ON scheduling_schedulerun
    REFERENCING NEW TABLE AS new_runs FOR EACH STATEMENT EXECUTE FUNCTION scheduling_count_fixed_runs();
CREATE TRIGGER scheduling_schedulerun_count_update AFTER UPDATE ON scheduling_schedulerun
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs FOR EACH STATEMENT
    EXECUTE FUNCTION scheduling_count_fixed_runs();
"""

DROP = """
DROP TRIGGER IF EXISTS scheduling_jobattempt_count ON scheduling_jobattempt;
DROP TRIGGER IF EXISTS scheduling_schedulerun_count_insert ON scheduling_schedulerun;
DROP TRIGGER IF EXISTS scheduling_schedulerun_count_update ON scheduling_schedulerun;
DROP FUNCTION IF EXISTS scheduling_count_attempts();
DROP FUNCTION IF EXISTS scheduling_count_fixed_runs();
"""

# Counts from the history still present when the migration runs, so counters start from what is known.
SEED = """
INSERT INTO scheduling_outcomecounter (metric, label, outcome, value)
SELECT 'job_attempts', j.kind, a.outcome, count(*)
FROM scheduling_jobattempt AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
GROUP BY j.kind, a.outcome
UNION ALL
SELECT 'jobs_finished', kind, state, count(*) FROM scheduling_scheduledjob WHERE state IN ('done', 'dead')
GROUP BY kind, state
UNION ALL
SELECT 'fixed_runs', t.name, r.state, count(*)
FROM scheduling_schedulerun AS r
JOIN scheduling_schedulepolicy AS p ON p.id = r.schedule_id
JOIN django_celery_beat_periodictask AS t ON t.id = p.periodic_task_id
WHERE r.state <> 'running'
GROUP BY t.name, r.state;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0014_scheduledjob_add_return_value"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutcomeCounter",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "metric",
                    models.CharField(
                        help_text="job_attempts, jobs_finished, job_retries, jobs_reclaimed or fixed_runs.",
                        max_length=32,
                        verbose_name="metric",
                    ),
                ),
                (
                    "label",
                    models.CharField(
                        help_text="The job's kind, or the fixed-time schedule's name.",
                        max_length=200,
                        verbose_name="label",
                    ),
                ),
                (
                    "outcome",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="How it ended ('' if n/a).",
                        max_length=16,
                        verbose_name="outcome",
                    ),
                ),
                ("value", models.BigIntegerField(default=0, help_text="How many so far.", verbose_name="value")),
            ],
            options={
                "verbose_name": "outcome counter",
                "constraints": [
                    models.UniqueConstraint(fields=("metric", "label", "outcome"), name="outcomecounter_key_uniq")
                ],
            },
        ),
        migrations.RunSQL(ATTEMPTS_FUNCTION + RUNS_FUNCTION + TRIGGERS + SEED, DROP),
    ]
