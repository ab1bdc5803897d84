-- Dashboard, /metrics and /healthz: read-only, database clock, bounded to a recent window.
-- Loaded once by scheduling.web.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: beat_heartbeat
-- The leading beat's heartbeat and its age by the database clock (no row: no beat ever led).
SELECT holder, acquired_at, heartbeat_at, extract(epoch FROM now() - heartbeat_at)::float8 AS age_seconds
FROM scheduling_schedulerheartbeat
WHERE role = %(role)s;

-- name: attempt_lag_histogram
-- The same lags as a histogram: bucket i holds lags in [bounds[i], bounds[i+1]) (0 below the
-- first bound); the caller makes the buckets cumulative. A lag counts from the later of the
-- attempt's due time and the job's creation (a job scheduled into the past did not wait before it existed).
WITH lags AS (
    SELECT greatest(extract(epoch FROM a.started_at - greatest(a.due_at, j.created_at)), 0)::float8 AS lag
    FROM scheduling_jobattempt AS a
    JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
    WHERE a.finished_at >= now() - make_interval(secs => %(window)s)
      AND a.started_at >= now() - make_interval(secs => %(window)s)
)
SELECT width_bucket(lag, %(bounds)s::float8[]) AS bucket, count(*) AS count, sum(lag) AS total_seconds
FROM lags
GROUP BY 1
ORDER BY 1;

-- name: upcoming_jobs
-- Pending jobs due in the next `horizon` seconds, per kind and per hour from now (0 = the next hour).
SELECT kind, floor(extract(epoch FROM due_at - now()) / 3600)::int AS hour, count(*) AS count, min(due_at) AS first_due
FROM scheduling_scheduledjob
WHERE state = 'pending' AND due_at > now() AND due_at <= now() + make_interval(secs => %(horizon)s)
GROUP BY 1, 2
ORDER BY 2, 1;

-- name: attempt_outcomes
-- Attempts that ended in the last `window` seconds, per kind and outcome.
SELECT j.kind, a.outcome, count(*) AS count
FROM scheduling_jobattempt AS a
JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
WHERE a.finished_at >= now() - make_interval(secs => %(window)s)
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: schedule_run_states
-- Fixed-time runs that started in the last `window` seconds, per schedule and state, with each
-- schedule's latest success (kept by the history limits, so it may be older than the window).
SELECT t.name AS schedule, r.state, count(*) FILTER (WHERE r.started_at >= now() - make_interval(secs => %(window)s)) AS count,
       max(r.finished_at) FILTER (WHERE r.state = 'succeeded') AS last_success
FROM scheduling_schedulerun AS r
JOIN scheduling_schedulepolicy AS p ON p.id = r.schedule_id
JOIN django_celery_beat_periodictask AS t ON t.id = p.periodic_task_id
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: attempt_lag_buckets
-- Due-to-start lag (started_at minus the later of due_at and the job's creation, never below 0:
-- a job scheduled into the past waited only from its creation) of the attempts that started in the last
-- `window` seconds, per `bucket` seconds (date_bin from the epoch), with p50, p99 and max; the row
-- whose bucket is NULL is the whole window (its p99 is where the dashboard clips its axis). The
-- finished_at bound lets jobattempt_finished_idx find the rows; each job is read by its key.
WITH lags AS (
    SELECT a.started_at, greatest(extract(epoch FROM a.started_at - greatest(a.due_at, j.created_at)), 0)::float8 AS lag
    FROM scheduling_jobattempt AS a
    JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
    WHERE a.finished_at >= now() - make_interval(secs => %(window)s)
      AND a.started_at >= now() - make_interval(secs => %(window)s)
)
SELECT date_bin(make_interval(secs => %(bucket)s), started_at, timestamptz '1970-01-01 00:00:00+00') AS at,
       count(*) AS attempts,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
       max(lag) AS max
FROM lags
GROUP BY GROUPING SETS ((1), ())
ORDER BY 1 NULLS FIRST;

-- name: waiting_history
-- What was waiting at `points` + 1 instants over the last `window` seconds, rebuilt from row
-- timestamps (when each row became due, or was created if later: a job scheduled into the past
-- waits from its creation, not before it existed; and when it started or ended), in two series: `waiting` (due and not started: pending, or
-- claimed and not yet started by a worker) and `paused` (due, pending, of a kind paused now).
-- A claim still not started keeps waiting until now; a started claim waited until its claim (its
-- start time is not stored before its attempt is written). Pausing is read as it is now: a kind
-- paused a minute ago shows its earlier wait as paused too.
WITH bounds AS (
    SELECT now() - make_interval(secs => %(window)s) AS t_start,
           %(window)s::float8 / %(points)s AS step, %(points)s::int AS n
), paused AS (
    SELECT kind FROM scheduling_kindcontrol WHERE paused
), waits AS (
    SELECT 'w' AS series, greatest(a.due_at, j.created_at) AS since, coalesce(a.started_at, a.finished_at) AS until
    FROM scheduling_jobattempt AS a
    JOIN scheduling_scheduledjob AS j ON j.id = a.job_id, bounds
    WHERE a.finished_at >= bounds.t_start
    UNION ALL
    SELECT 'w', greatest(j.due_at, j.created_at),
           CASE WHEN j.state = 'claimed' THEN now() + interval '1 day' ELSE j.claimed_at END
    FROM scheduling_scheduledjob AS j, bounds
    WHERE j.state IN ('claimed', 'running') AND j.claimed_at IS NOT NULL
      AND (j.state = 'claimed' OR j.claimed_at >= bounds.t_start)
    UNION ALL
    SELECT CASE WHEN j.kind IN (SELECT kind FROM paused) THEN 'p' ELSE 'w' END, greatest(j.due_at, j.created_at),
           now() + interval '1 day'
    FROM scheduling_scheduledjob AS j
    WHERE j.state = 'pending' AND j.due_at <= now()
    UNION ALL
    SELECT 'w', greatest(j.due_at, j.created_at), j.finished_at
    FROM scheduling_scheduledjob AS j, bounds
    WHERE j.state = 'cancelled' AND j.finished_at >= bounds.t_start AND greatest(j.due_at, j.created_at) < j.finished_at
), spans AS (
    SELECT w.series,
           greatest(0, ceil(extract(epoch FROM w.since - b.t_start) / b.step))::int AS first_i,
           least(b.n, ceil(extract(epoch FROM w.until - b.t_start) / b.step) - 1)::int AS last_i
    FROM waits AS w, bounds AS b
    WHERE w.until > b.t_start
), deltas AS (
    SELECT i,
           sum(d) FILTER (WHERE series = 'w') AS dw,
           sum(d) FILTER (WHERE series = 'p') AS dp
    FROM (SELECT series, first_i AS i, 1 AS d FROM spans WHERE first_i <= last_i
          UNION ALL
          SELECT series, last_i + 1, -1 FROM spans WHERE first_i <= last_i) AS e
    GROUP BY i
)
SELECT b.t_start + make_interval(secs => g.i * b.step) AS at,
       (sum(coalesce(deltas.dw, 0)) OVER (ORDER BY g.i))::bigint AS waiting,
       (sum(coalesce(deltas.dp, 0)) OVER (ORDER BY g.i))::bigint AS paused
FROM bounds AS b
CROSS JOIN generate_series(0, b.n) AS g(i)
LEFT JOIN deltas ON deltas.i = g.i
ORDER BY g.i;

-- name: health_backlog
-- The backlog /healthz judges: pending, overdue jobs that are the system's own (no owner: scheduled
-- by code) or of a kind flagged critical, outside paused and rate-limited kinds (their jobs wait by
-- the operator's choice, as status() and /metrics count them apart), counted up to limit + 1 like
-- backlog_status. Other owners' jobs of other kinds are not counted, so no caller of the API can
-- flip the health check (status() and /metrics still count every job).
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
                           WHERE state = 'pending' AND due_at <= now()
                             AND (owner_id IS NULL OR kind = ANY(%(critical)s::text[]))
                             AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused OR rate_limit IS NOT NULL)
                           LIMIT %(limit)s + 1) AS capped) AS backlog,
    (SELECT coalesce(extract(epoch FROM now() - min(due_at)), 0)::float8
       FROM scheduling_scheduledjob
      WHERE state = 'pending' AND due_at <= now()
        AND (owner_id IS NULL OR kind = ANY(%(critical)s::text[]))
        AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused OR rate_limit IS NOT NULL)) AS oldest_overdue_seconds;

-- name: outcome_counters
-- The monotonic outcome counters (/metrics' *_total), kept by the triggers of migration 0015 (0022) in
-- the transactions that record the outcomes; the pruner's deletes never lower them.
SELECT metric, label, outcome, value
FROM scheduling_outcomecounter
ORDER BY metric, label, outcome;

-- name: recurrence_state_counts
SELECT state, count(*) AS n FROM scheduling_recurrence GROUP BY state ORDER BY state;

-- name: recurrence_planner_lag
-- Active recurrences whose latest occurrence has finished but whose next is not created yet (the
-- planner's pick: no live occurrence), and how long the oldest has waited since its instant.
SELECT count(*) AS waiting, coalesce(extract(epoch FROM now() - min(r.current_at)), 0)::float8 AS oldest_seconds
FROM scheduling_recurrence AS r
WHERE r.state = 'active' AND r.current_at <= now()
  AND NOT EXISTS (SELECT 1 FROM scheduling_scheduledjob AS o
                  WHERE o.recurrence_id = r.id AND NOT (o.state IN ('done', 'cancelled', 'dead')));

-- name: upcoming_occurrences
-- Pending recurrence occurrences due in the next `horizon` seconds, per kind (the dashboard).
SELECT kind, count(*) AS count, min(due_at) AS first_due
FROM scheduling_scheduledjob
WHERE state = 'pending' AND recurrence_id IS NOT NULL AND due_at > now()
  AND due_at <= now() + make_interval(secs => %(horizon)s)
GROUP BY kind
ORDER BY kind;

-- name: outcome_buckets
-- What finished in the last `window` seconds, per `bucket` seconds (date_bin from the epoch), kind
-- and outcome: attempts that succeeded, attempts that failed (failed, timed out or taken back from a
-- dead worker, a handler's RetryAfter or Discard; a job's last failed attempt among them; not a snooze
-- nor a handler's cancel) and jobs that became dead. Attempts are found
-- through jobattempt_finished_idx and their jobs by key; dead jobs through scheduledjob_finished_idx.
SELECT date_bin(make_interval(secs => %(bucket)s), a.finished_at, timestamptz '1970-01-01 00:00:00+00') AS at,
       j.kind, CASE WHEN a.outcome = 'succeeded' THEN 'succeeded' ELSE 'failed' END AS outcome, count(*) AS count
FROM scheduling_jobattempt AS a
JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
WHERE a.finished_at >= now() - make_interval(secs => %(window)s) AND a.outcome NOT IN ('snoozed', 'cancelled')
GROUP BY 1, 2, 3
UNION ALL
SELECT date_bin(make_interval(secs => %(bucket)s), finished_at, timestamptz '1970-01-01 00:00:00+00'), kind, 'dead', count(*)
FROM scheduling_scheduledjob
WHERE state = 'dead' AND finished_at >= now() - make_interval(secs => %(window)s)
GROUP BY 1, 2
ORDER BY 1, 2, 3;

-- name: error_classes
-- The commonest error classes (the text before the first colon of last_error: "ValueError" of
-- "ValueError: boom", "claim expired" of the sweeper's words) with their counts, among at most
-- `sample` dead jobs (the latest first, from scheduledjob_finished_idx) and `sample` failed jobs
-- waiting for a retry (the soonest first, from the pending index). The samples bound the cost: a
-- million dead rows are not read to fill a list filter.
SELECT left(split_part(last_error, ':', 1), 80) AS error_class, count(*) AS count
FROM ((SELECT last_error FROM scheduling_scheduledjob
       WHERE state = 'dead' AND finished_at IS NOT NULL
       ORDER BY finished_at DESC LIMIT %(sample)s)
      UNION ALL
      (SELECT last_error FROM scheduling_scheduledjob
       WHERE state = 'pending' AND last_error <> ''
       ORDER BY due_at LIMIT %(sample)s)) AS failed
WHERE last_error <> ''
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT %(top)s;

-- name: state_counts
-- Jobs per state, each counted up to `cap` + 1 rows from the state's own index (the pending and
-- claimed set's partial indexes, the finished index for done, cancelled and dead): a million done rows
-- cost no more than `cap`. A count of cap + 1 means "more than cap".
SELECT 'pending' AS state, (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending'
                                                  LIMIT %(cap)s + 1) AS c) AS count
UNION ALL
SELECT 'claimed', (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'claimed'
                                         AND claimed_at IS NOT NULL LIMIT %(cap)s + 1) AS c)
UNION ALL
SELECT 'running', (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'running'
                                         AND claimed_at IS NOT NULL LIMIT %(cap)s + 1) AS c)
UNION ALL
SELECT 'dead', (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'dead'
                                      AND finished_at IS NOT NULL LIMIT %(cap)s + 1) AS c)
UNION ALL
SELECT 'done', (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'done'
                                      AND finished_at IS NOT NULL LIMIT %(cap)s + 1) AS c)
UNION ALL
SELECT 'cancelled', (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'cancelled'
                                           AND finished_at IS NOT NULL LIMIT %(cap)s + 1) AS c);

-- name: check_jsonpath
-- Whether a JSON path parses (the jobs list's search): an error here is a message, not a broken page.
SELECT %(path)s::jsonpath::text;

-- name: limit_statement_time
-- Stop any statement of the current transaction that runs longer than `ms` milliseconds (the jobs
-- list's searches); the setting ends with the transaction.
SELECT set_config('statement_timeout', %(ms)s, true);
