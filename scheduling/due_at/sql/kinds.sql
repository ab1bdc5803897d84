-- Kind controls: pause and the per-kind options (core/kind_options.py), read by claim_due_jobs. Loaded once by scheduling.due_at.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: set_kind_paused
-- Pause or resume a kind (a row per controlled kind; resuming keeps the row for its options).
-- options: every column but kind, paused and updated_at, by name (core/kind_options.py's names).
INSERT INTO scheduling_kindcontrol AS c (kind, paused, updated_at)
VALUES (%(kind)s, %(paused)s, now())
ON CONFLICT (kind) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
RETURNING c.kind, c.paused, to_jsonb(c) - 'kind' - 'paused' - 'updated_at' AS options;

-- name: set_kind_options
-- Set options of a kind (core/kind_options.py; %(options)s is {name: value}, each name its column),
-- creating its row unpaused; options not named keep their values. max_running caps how many jobs
-- of the kind may be claimed or running at once, cluster-wide (NULL: no cap). A new option adds
-- its column to the insert's list and a line to the update's.
INSERT INTO scheduling_kindcontrol AS c (kind, paused, updated_at, max_running)
SELECT %(kind)s, false, now(), (v.o ->> 'max_running')::integer
FROM (SELECT %(options)s::jsonb AS o) AS v
ON CONFLICT (kind) DO UPDATE SET
    max_running = CASE WHEN %(options)s::jsonb ? 'max_running' THEN EXCLUDED.max_running ELSE c.max_running END,
    updated_at = now()
RETURNING c.kind, c.paused, to_jsonb(c) - 'kind' - 'paused' - 'updated_at' AS options;

-- name: set_kind_rate
-- An operator's rate limit for a kind (NULL limit: none), kept over the handler's registered one. Not
-- set_kind_options: a rate is three columns (limit, period, partition) and who set it. Returns the
-- options as set_kind_options does (the rate's columns are among them).
INSERT INTO scheduling_kindcontrol AS c (kind, paused, max_running, rate_limit, rate_period_seconds, rate_partition_by,
                                         rate_set_by_operator, updated_at)
VALUES (%(kind)s, false, NULL, %(limit)s, %(per_seconds)s, %(partition_by)s, true, now())
ON CONFLICT (kind) DO UPDATE
SET rate_limit = EXCLUDED.rate_limit, rate_period_seconds = EXCLUDED.rate_period_seconds,
    rate_partition_by = EXCLUDED.rate_partition_by, rate_set_by_operator = true, updated_at = now()
RETURNING c.kind, c.paused, to_jsonb(c) - 'kind' - 'paused' - 'updated_at' AS options;

-- name: sync_code_rates
-- The handlers' registered rates (%(kinds)s with %(limits)s per %(periods)s, partitioned by
-- %(partitions)s) written to their control rows, unless an operator set the kind's rate; a kind
-- whose registered rate was removed loses it (its row stays for its other controls). Changes
-- nothing when the rows already say so (no write, no lock on a row that is up to date).
WITH code AS (
    SELECT * FROM unnest(%(kinds)s::text[], %(limits)s::int[], %(periods)s::float8[], %(partitions)s::text[])
        AS t(kind, rate_limit, rate_period_seconds, rate_partition_by)
), added AS (
    INSERT INTO scheduling_kindcontrol AS c (kind, paused, max_running, rate_limit, rate_period_seconds,
                                             rate_partition_by, rate_set_by_operator, updated_at)
    SELECT kind, false, NULL, rate_limit, rate_period_seconds, rate_partition_by, false, now() FROM code
    ON CONFLICT (kind) DO UPDATE
    SET rate_limit = EXCLUDED.rate_limit, rate_period_seconds = EXCLUDED.rate_period_seconds,
        rate_partition_by = EXCLUDED.rate_partition_by, updated_at = now()
    WHERE NOT c.rate_set_by_operator
      AND (c.rate_limit, c.rate_period_seconds, c.rate_partition_by)
          IS DISTINCT FROM (EXCLUDED.rate_limit, EXCLUDED.rate_period_seconds, EXCLUDED.rate_partition_by)
    RETURNING c.kind
), removed AS (
    UPDATE scheduling_kindcontrol AS c
    SET rate_limit = NULL, rate_period_seconds = NULL, rate_partition_by = '', updated_at = now()
    WHERE NOT c.rate_set_by_operator AND c.rate_limit IS NOT NULL AND c.kind <> ALL(%(kinds)s::text[])
      AND c.kind = ANY(%(registered)s::text[])
    RETURNING c.kind
)
SELECT kind FROM added UNION ALL SELECT kind FROM removed;

-- name: kind_controls
-- Every kind with a control, its options by name (as above), with its pending-and-due and claimed
-- counts (for status and the admin).
SELECT c.kind, c.paused, to_jsonb(c) - 'kind' - 'paused' - 'updated_at' AS options,
       (SELECT count(*) FROM scheduling_scheduledjob AS j
        WHERE j.state = 'pending' AND j.kind = c.kind AND j.due_at <= now()) AS due,
       (SELECT count(*) FROM scheduling_scheduledjob AS j
        WHERE j.state IN ('claimed', 'running') AND j.kind = c.kind) AS claimed
FROM scheduling_kindcontrol AS c
ORDER BY c.kind;

-- name: kind_breakdown
-- Per kind: due (pending, due time passed), claimed and not started (queued), running (started),
-- and dead in the last 24 h. Each arm of the WHERE is an indexed range (the
-- pending partial index, the claimed partial index, finished_at), so a big history is not read.
SELECT kind,
       count(*) FILTER (WHERE state = 'pending') AS due,
       count(*) FILTER (WHERE state = 'claimed') AS claimed,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'dead') AS dead_24h
FROM scheduling_scheduledjob
WHERE (state = 'pending' AND due_at <= now())
   OR (state IN ('claimed', 'running') AND claimed_at IS NOT NULL)
   OR (state = 'dead' AND finished_at > now() - interval '24 hours')
GROUP BY kind
ORDER BY kind;

-- name: rate_limited_due
-- The shortest refill interval (rate_period_seconds / rate_limit: one start's worth of window, per
-- partition for a partitioned rate) among the rate-limited kinds (not paused) with a due job
-- waiting; NULL when none waits. The control loop claims again after that long (at least
-- RATE_STEP_SECONDS), as the kind's window frees room, instead of sleeping to its next due time.
-- Per kind, one probe per priority of the (kind, priority, due_at) index, stopped at the first due
-- row: a LATERAL with a LIMIT is run per control row (an EXISTS may be turned into a join that reads
-- every due row, and was, by a planner whose statistics said few rows were pending: 5 ms a turn in
-- bench flow with 8,000 due). Called on most turns of the control loop while a kind waits. Each probe
-- is written as the claim's branches are (claim.sql), and run with sorts off (store.INDEX_COSTS), so
-- that only that index gives its order: a probe for "any row" read, on a quiet table's statistics,
-- every due row through the due_at index for each empty priority (20-32 ms a call, 18,000 due).
SELECT min(c.rate_period_seconds / c.rate_limit) AS refill_seconds
FROM scheduling_kindcontrol AS c
CROSS JOIN LATERAL (
    -- repeat p in 9..0 joined by UNION ALL
    (SELECT 1 FROM scheduling_scheduledjob AS j
     WHERE j.state = 'pending' AND j.kind = ANY(ARRAY[c.kind]) AND j.priority = {p} AND j.due_at <= now()
     ORDER BY j.kind, j.due_at LIMIT 1)
    -- end repeat
    LIMIT 1
) AS due
WHERE c.rate_limit IS NOT NULL AND NOT c.paused;
