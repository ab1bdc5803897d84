-- Every hand-written statement Timekeeper runs, by name. Loaded once by scheduling.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: insert_job
-- A plain insert; the caller's transaction decides whether it survives.
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
     claimed_by, created_at, updated_at)
VALUES (%(kind)s, %(payload)s::jsonb, coalesce(%(due_at)s, now() + make_interval(secs => %(delay)s)), 'pending',
        %(lease_seconds)s, 0, %(max_attempts)s, '', %(key)s, %(owner_id)s, '', now(), now())
RETURNING id, due_at, extract(epoch FROM due_at - now())::float8 AS in_seconds;

-- name: upsert_job_replace
-- on_conflict="replace": a second job for a key that already has a pending job moves that job
-- (new due time, payload, attempts budget) instead of adding a row. A claimed job is running and
-- is not touched: no row comes back and the caller reports the conflict.
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
     claimed_by, created_at, updated_at)
VALUES (%(kind)s, %(payload)s::jsonb, coalesce(%(due_at)s, now() + make_interval(secs => %(delay)s)), 'pending',
        %(lease_seconds)s, 0, %(max_attempts)s, '', %(key)s, %(owner_id)s, '', now(), now())
ON CONFLICT (key) WHERE state IN ('pending', 'claimed') DO UPDATE
    SET kind = EXCLUDED.kind, payload = EXCLUDED.payload, due_at = EXCLUDED.due_at,
        max_attempts = greatest(EXCLUDED.max_attempts, scheduling_scheduledjob.attempts + 1),
        lease_seconds = EXCLUDED.lease_seconds, owner_id = EXCLUDED.owner_id, updated_at = now()
    WHERE scheduling_scheduledjob.state = 'pending'
RETURNING id, due_at, extract(epoch FROM due_at - now())::float8 AS in_seconds;

-- name: upsert_job_keep
-- on_conflict="keep" and "error": never touch the live job; no row back means the key is taken.
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
     claimed_by, created_at, updated_at)
VALUES (%(kind)s, %(payload)s::jsonb, coalesce(%(due_at)s, now() + make_interval(secs => %(delay)s)), 'pending',
        %(lease_seconds)s, 0, %(max_attempts)s, '', %(key)s, %(owner_id)s, '', now(), now())
ON CONFLICT (key) WHERE state IN ('pending', 'claimed') DO NOTHING
RETURNING id, due_at, extract(epoch FROM due_at - now())::float8 AS in_seconds;

-- name: live_job_by_key
SELECT id, state FROM scheduling_scheduledjob WHERE key = %(key)s AND state IN ('pending', 'claimed');

-- name: job_state
SELECT state FROM scheduling_scheduledjob WHERE id = %(id)s;

-- name: cancel_job
UPDATE scheduling_scheduledjob
SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = %(id)s AND state = 'pending'
RETURNING id;

-- name: cancel_jobs
-- Bulk cancel for the admin: only pending rows change; the rest are reported by the caller.
UPDATE scheduling_scheduledjob
SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
RETURNING id;

-- name: reschedule_job
UPDATE scheduling_scheduledjob
SET due_at = %(due_at)s, updated_at = now()
WHERE id = %(id)s AND state = 'pending'
RETURNING id, due_at, extract(epoch FROM due_at - now())::float8 AS in_seconds;

-- name: reschedule_jobs
UPDATE scheduling_scheduledjob
SET due_at = %(due_at)s, updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
RETURNING id;

-- name: run_jobs_now
UPDATE scheduling_scheduledjob
SET due_at = now(), updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
RETURNING id;

-- name: retry_dead_jobs
-- A dead job gets a fresh attempts budget and is due now. Its key may have been reused by a
-- newer live job meanwhile: then it stays dead (the NOT EXISTS keeps the partial unique index happy).
UPDATE scheduling_scheduledjob AS j
SET state = 'pending', attempts = 0, due_at = now(), finished_at = NULL, token = NULL, claimed_at = NULL,
    heartbeat_at = NULL, claimed_by = '', updated_at = now()
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'dead'
  AND (j.key IS NULL OR NOT EXISTS (
        SELECT 1 FROM scheduling_scheduledjob AS o
        WHERE o.key = j.key AND o.state IN ('pending', 'claimed')))
RETURNING j.id;

-- name: claim_due_jobs
-- The claim is one statement so that choosing the rows and claiming them cannot be separated:
-- FOR UPDATE SKIP LOCKED makes concurrent claimers pass over each other's rows instead of waiting,
-- so any number of them get disjoint sets, and the partial index on due_at WHERE state = 'pending'
-- keeps this cheap however many finished rows the table holds. Each claim gets a new token
-- (fencing): only the holder of the current token can complete or fail the job.
WITH due AS (
    SELECT id
    FROM scheduling_scheduledjob
    WHERE state = 'pending' AND due_at <= now()
    ORDER BY due_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE scheduling_scheduledjob AS j
SET state = 'claimed', token = gen_random_uuid(), claimed_at = now(), heartbeat_at = now(),
    claimed_by = '', attempts = j.attempts + 1, updated_at = now()
FROM due
WHERE j.id = due.id
RETURNING j.id, j.token::text, j.kind;

-- name: next_due_times
-- Distinct due instants coming up soon, for early wake-ups (the row stays the truth).
SELECT DISTINCT date_trunc('milliseconds', due_at) AS at,
       extract(epoch FROM date_trunc('milliseconds', due_at) - now())::float8 AS in_seconds
FROM scheduling_scheduledjob
WHERE state = 'pending' AND due_at > now() AND due_at <= now() + make_interval(secs => %(horizon)s)
ORDER BY at
LIMIT %(limit)s;

-- name: start_jobs
-- A claim runs at most once: only rows still claimed under the presented token and not yet
-- started are handed to the handler. A redelivered message finds them started and leaves them
-- to the sweeper, which records the attempt and counts it against max_attempts.
WITH started AS (
    UPDATE scheduling_scheduledjob AS j
    SET claimed_by = %(worker)s, heartbeat_at = now()
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token)
    WHERE j.id = t.id AND j.token = t.token AND j.state = 'claimed' AND j.claimed_by = ''
    RETURNING j.id, j.token::text, j.kind, j.payload, j.attempts, j.max_attempts, j.due_at
)
SELECT started.*, clock_timestamp() AS db_now FROM started;

-- name: heartbeat_jobs
UPDATE scheduling_scheduledjob AS j
SET heartbeat_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token)
WHERE j.id = t.id AND j.token = t.token AND j.state = 'claimed'
RETURNING j.id;

-- name: complete_jobs
-- Success for a batch: conditional on the token, so a worker whose claim was taken back (and
-- maybe run again by someone else) cannot overwrite the newer attempt. One attempt row per job.
WITH input AS (
    SELECT t.id, t.token, t.started_at, t.finished_at, j.due_at, j.attempts, j.claimed_by
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(started)s::timestamptz[], %(finished)s::timestamptz[])
         AS t(id, token, started_at, finished_at)
    JOIN scheduling_scheduledjob AS j ON j.id = t.id
), done AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = 'done', finished_at = now(), updated_at = now(), heartbeat_at = NULL, last_error = ''
    FROM input
    WHERE j.id = input.id AND j.token = input.token AND j.state = 'claimed'
    RETURNING j.id
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error)
    SELECT input.id, input.attempts, input.token, input.claimed_by, input.due_at, input.started_at,
           input.finished_at, 'succeeded', ''
    FROM input JOIN done USING (id)
)
SELECT id FROM done;

-- name: fail_jobs
-- Failure or timeout for a batch: back to pending with the due time pushed by the caller's
-- backoff, or dead when the attempts are spent. Conditional on the token like complete_jobs.
WITH input AS (
    SELECT t.*, j.due_at AS old_due_at, j.attempts, j.max_attempts, j.claimed_by
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(started)s::timestamptz[], %(finished)s::timestamptz[],
                %(outcomes)s::text[], %(errors)s::text[], %(delays)s::float8[])
         AS t(id, token, started_at, finished_at, outcome, error, delay)
    JOIN scheduling_scheduledjob AS j ON j.id = t.id
), failed AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = CASE WHEN input.attempts >= input.max_attempts THEN 'dead' ELSE 'pending' END,
        due_at = CASE WHEN input.attempts >= input.max_attempts THEN j.due_at
                      ELSE now() + make_interval(secs => input.delay) END,
        finished_at = CASE WHEN input.attempts >= input.max_attempts THEN now() END,
        token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
        last_error = input.error, updated_at = now()
    FROM input
    WHERE j.id = input.id AND j.token = input.token AND j.state = 'claimed'
    RETURNING j.id, j.state, j.due_at
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error)
    SELECT input.id, input.attempts, input.token, input.claimed_by, input.old_due_at, input.started_at,
           input.finished_at, input.outcome, input.error
    FROM input JOIN failed USING (id)
)
SELECT id, state, due_at FROM failed;

-- name: release_jobs
-- A worker shutting down gives back claims it has not finished: back to pending now, the attempt
-- recorded as reclaimed (it counts against max_attempts, so a job that always outlives shutdowns dies).
WITH input AS (
    SELECT t.id, t.token, j.due_at, j.attempts, j.max_attempts, j.claimed_at, j.claimed_by
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token)
    JOIN scheduling_scheduledjob AS j ON j.id = t.id
), released AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = CASE WHEN input.attempts >= input.max_attempts THEN 'dead' ELSE 'pending' END,
        finished_at = CASE WHEN input.attempts >= input.max_attempts THEN now() END,
        token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
        last_error = %(reason)s, updated_at = now()
    FROM input
    WHERE j.id = input.id AND j.token = input.token AND j.state = 'claimed'
    RETURNING j.id, j.state
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error)
    SELECT input.id, input.attempts, input.token, input.claimed_by, input.due_at, input.claimed_at, now(),
           'reclaimed', %(reason)s
    FROM input JOIN released USING (id)
)
SELECT id, state FROM released;

-- name: sweep_expired_claims
-- The sweeper: claims whose holder stopped heartbeating for longer than the job's lease (or, with
-- heartbeats off, claims older than sweep_after) go back to pending, or to dead when their
-- attempts are spent. SKIP LOCKED and a LIMIT keep each statement short; the caller loops.
WITH stale AS (
    SELECT id, token, attempts, max_attempts, due_at, claimed_at, claimed_by
    FROM scheduling_scheduledjob
    WHERE state = 'claimed'
      AND CASE WHEN %(heartbeats)s
               THEN coalesce(heartbeat_at, claimed_at) < now() - make_interval(secs => lease_seconds)
               ELSE claimed_at < now() - make_interval(secs => %(sweep_after)s) END
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = CASE WHEN stale.attempts >= stale.max_attempts THEN 'dead' ELSE 'pending' END,
        finished_at = CASE WHEN stale.attempts >= stale.max_attempts THEN now() END,
        token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
        last_error = 'claim expired: the worker stopped heartbeating', updated_at = now()
    FROM stale
    WHERE j.id = stale.id
    RETURNING j.id, j.state
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error)
    SELECT stale.id, stale.attempts, stale.token, stale.claimed_by, stale.due_at, stale.claimed_at, now(),
           'reclaimed', 'claim expired: the worker stopped heartbeating'
    FROM stale JOIN moved USING (id)
)
SELECT id, state FROM moved;

-- name: prune_finished_jobs
-- History retention in small batches: each statement locks at most `limit` rows, briefly.
-- Attempts go in the same statement (the foreign key is checked at commit).
WITH victims AS (
    SELECT id FROM scheduling_scheduledjob
    WHERE state IN ('done', 'cancelled', 'dead') AND finished_at < now() - make_interval(days => %(days)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM scheduling_jobattempt WHERE job_id IN (SELECT id FROM victims)
)
DELETE FROM scheduling_scheduledjob WHERE id IN (SELECT id FROM victims)
RETURNING id;

-- name: backlog_status
-- One pass over the partial indexes for the numbers operators watch.
SELECT
    (SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()) AS backlog,
    (SELECT coalesce(extract(epoch FROM now() - min(due_at)), 0)::float8
       FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()) AS oldest_overdue_seconds,
    (SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'pending') AS pending,
    (SELECT count(*) FROM scheduling_scheduledjob
       WHERE state = 'pending' AND due_at > now() AND due_at <= now() + interval '24 hours') AS due_next_24h,
    (SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'claimed') AS claimed,
    (SELECT count(*) FROM scheduling_scheduledjob
       WHERE state = 'claimed'
         AND (coalesce(heartbeat_at, claimed_at) < now() - make_interval(secs => lease_seconds)
              OR claimed_at < now() - make_interval(secs => %(stuck_after)s))) AS stuck,
    (SELECT count(*) FROM scheduling_scheduledjob
       WHERE state = 'dead' AND finished_at > now() - interval '24 hours') AS dead_last_24h;
