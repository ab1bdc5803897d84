"""The attempts-counting trigger finds each new attempt's job by primary key, whatever the statistics say.

The trigger of 0015 joined the statement's new attempts to the jobs table four times, each with its
own filter on the job's state (``state IN ('done', 'dead')``, ``state = 'pending'``). Those filters
match the finished and pending partial indexes, and with statistics that say few jobs are finished
(a table that filled since its last analyze) the planner read the whole finished index, or every
pending row, and hashed it against the batch. PL/pgSQL keeps that plan for the session, so one
batch outcome of 50 jobs took 25 ms on average in a spike of 100,000 jobs, and grew with the rows
finished since the last analyze (6,650 buffers a call).

Here each new attempt meets its job once, by ``j.id = a.job_id`` alone, and the four counters are
four rows of a VALUES list filtered by their own conditions: no condition on the job's state is a
filter on the jobs table, so the primary key is its only way in. The counts are the same.
"""

from django.db import migrations

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

# 0015's function, for the way back.
JOINED_FOUR_TIMES = """
CREATE OR REPLACE FUNCTION scheduling_count_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
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


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0021_claimed_index_only_for_whole_set_scans"),
    ]

    operations = [migrations.RunSQL(BY_KEY, JOINED_FOUR_TIMES)]
