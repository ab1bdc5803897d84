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
