-- Aborting jobs (api.abort): the request a running job's worker reads back with its heartbeat.
-- Loaded once by scheduling.due_at.store. The request is a row of scheduling_jobabort, not an
-- UPDATE of the job: a running atomic job's row is locked by its chunk for as long as its handler
-- runs, and these statements must not wait for the handler they ask to stop (they read the job's
-- state without locking it). The runner writes the outcome (set_job_states, event "aborted").

-- name: request_aborts
-- Ask the running jobs among %(ids)s to stop: one request per claim (token), the first asker's kept
-- while it stands (asking again is not an error); a request left by an earlier attempt is replaced.
-- Returns the running jobs asked (their worker's heartbeat reads the request within an interval).
WITH running AS (
    SELECT id, token FROM scheduling_scheduledjob
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running'
), asked AS (
    INSERT INTO scheduling_jobabort (job_id, token, requested_at, requested_by)
    SELECT id, token, now(), %(by)s FROM running
    ON CONFLICT (job_id) DO UPDATE
        SET token = EXCLUDED.token, requested_at = EXCLUDED.requested_at, requested_by = EXCLUDED.requested_by
        WHERE scheduling_jobabort.token <> EXCLUDED.token
)
SELECT id FROM running;

-- name: unstarted_claims
-- The claims among %(ids)s not started yet (an abort cancels them: set_job_states, event "abort").
SELECT id, token::text AS token FROM scheduling_scheduledjob
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'claimed';

-- name: job_abort
-- The abort asked for a job's current or last claim (the job page shows who and when).
SELECT a.requested_at, a.requested_by, a.token = j.token AS current_claim
FROM scheduling_jobabort AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
WHERE a.job_id = %(id)s;

-- name: prune_aborts
-- Requests of jobs pruned meanwhile (no foreign key removes them: see the model).
DELETE FROM scheduling_jobabort AS a
WHERE NOT EXISTS (SELECT 1 FROM scheduling_scheduledjob AS j WHERE j.id = a.job_id);

-- name: abortable_job_by_key
-- The owner's (NULL: the system's) running or claimed job for a key (abort by key): its newest;
-- else its newest job of any state, to name the state that refuses the abort.
SELECT id, state FROM scheduling_scheduledjob
WHERE coalesce(owner_id, 0) = coalesce(%(owner_id)s::integer, 0) AND key = %(key)s AND key IS NOT NULL
ORDER BY state IN ('running', 'claimed') DESC, id DESC
LIMIT 1;
