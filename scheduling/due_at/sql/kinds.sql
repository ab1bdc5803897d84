-- Kind controls: pause and concurrency caps, read by claim_due_jobs. Loaded once by scheduling.due_at.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: set_kind_paused
-- Pause or resume a kind (a row per controlled kind; resuming keeps the row for its cap).
INSERT INTO scheduling_kindcontrol (kind, paused, max_running, updated_at)
VALUES (%(kind)s, %(paused)s, NULL, now())
ON CONFLICT (kind) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
RETURNING kind, paused, max_running;

-- name: set_kind_max_running
-- Cap (or uncap: NULL) how many jobs of a kind may be claimed or running at once, cluster-wide.
INSERT INTO scheduling_kindcontrol (kind, paused, max_running, updated_at)
VALUES (%(kind)s, false, %(max_running)s, now())
ON CONFLICT (kind) DO UPDATE SET max_running = EXCLUDED.max_running, updated_at = now()
RETURNING kind, paused, max_running;

-- name: kind_controls
-- Every kind with a control, with its pending-and-due and claimed counts (for status and the admin).
SELECT c.kind, c.paused, c.max_running,
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
