-- Scheduling due_at jobs: insert, upsert by key, look up, cancel, reschedule, run now, retry.
-- Loaded once by scheduling.due_at.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: insert_job
-- A plain insert; the caller's transaction decides whether it survives. The row and the INSERT are
-- the core's parts (core/sql/jobs.sql), shared with every door that adds a job.
WITH new_jobs AS (
    -- include: options_as_new_job
)
-- include: insert_into_jobs
RETURNING id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8 AS in_seconds;

-- name: insert_jobs
-- Bulk insert for schedule_many: one statement for any number of rows of one kind (no keys), in
-- the caller's transaction. The payloads come as one text array; ORDINALITY keeps their order.
-- clock_timestamp() is read once (the scalar subquery), so every row gets the same due time.
WITH new_jobs AS (
    SELECT %(kind)s::text AS kind, t.payload::jsonb AS payload,
           coalesce(%(due_at)s::timestamptz,
                    CASE WHEN %(delay)s > 0 THEN (SELECT clock_timestamp()) + make_interval(secs => %(delay)s)
                         ELSE now() END) AS due_at,
           'pending'::text AS state, %(lease_seconds)s::integer AS lease_seconds, 0 AS attempts,
           %(max_attempts)s::integer AS max_attempts, ''::text AS last_error, NULL::text AS key,
           %(owner_id)s::integer AS owner_id, NULL::timestamptz AS finished_at, %(priority)s::integer AS priority,
           %(timeout_seconds)s::float8 AS timeout_seconds, %(backoff_base_seconds)s::float8 AS backoff_base_seconds,
           %(backoff_cap_seconds)s::float8 AS backoff_cap_seconds, %(atomic)s::boolean AS atomic,
           NULL::bigint AS recurrence_id, NULL::timestamptz AS occurrence_at,
           NULL::text AS unique_key, NULL::varchar[] AS unique_states
    FROM unnest(%(payloads)s::text[]) WITH ORDINALITY AS t(payload, n)
    ORDER BY t.n
)
-- include: insert_into_jobs
RETURNING id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8 AS in_seconds;

-- name: upsert_job_replace
-- on_conflict="replace". Keys are per owner (NULL owner = the system's namespace), so this only
-- ever meets the caller's own jobs. The key's job is its *waiting* one; a running job (claimed and
-- started by a worker) is never touched, never even locked: its atomic chunk may hold its row for
-- seconds, and a successor may wait beside it.
--   1. The unique index scheduledjob_waiting_owner_key_uniq holds the key's first-attempt waiting
--      job: pending and never run, or claimed and not yet started. ON CONFLICT meets it and moves it
--      (new payload, due time, budget); a claim not yet started is taken back (pending, token
--      cleared, its attempt given back: the queued message then finds no claim under its token and
--      runs nothing). Two callers racing on a new key cannot both insert.
--   2. A pending retry (attempts >= 1: a started attempt failed or was reclaimed) is outside the
--      index, so `retry` finds it, the newest, when the index holds nothing for the key, and moves
--      it keeping its attempts (the budget grows to allow one more try). Its lock is only ever held
--      briefly (the claim statement, another schedule call's transaction), never by a running chunk.
--   3. Otherwise a new row: the successor of a running job, or the key's first job.
-- inserted (xmax = 0) tells a new row from a moved one.
WITH retry AS (
    SELECT r.id FROM scheduling_scheduledjob AS r
    WHERE coalesce(r.owner_id, 0) = coalesce(%(owner_id)s::integer, 0) AND r.key = %(key)s
      AND r.state = 'pending' AND r.attempts > 0
      AND NOT EXISTS (
          SELECT 1 FROM scheduling_scheduledjob AS w
          WHERE coalesce(w.owner_id, 0) = coalesce(%(owner_id)s::integer, 0) AND w.key = %(key)s
            AND ((w.state = 'pending' AND w.attempts = 0) OR (w.state = 'claimed' AND w.attempts = 1)))
    ORDER BY r.id DESC
    LIMIT 1
    FOR UPDATE OF r
), moved AS (
    UPDATE scheduling_scheduledjob AS j
    SET kind = %(kind)s, payload = %(payload)s::jsonb,
        due_at = coalesce(%(due_at)s, CASE WHEN %(delay)s > 0 THEN clock_timestamp() + make_interval(secs => %(delay)s) ELSE now() END),
        max_attempts = greatest(%(max_attempts)s, j.attempts + 1), lease_seconds = %(lease_seconds)s,
        priority = %(priority)s, timeout_seconds = %(timeout_seconds)s,
        backoff_base_seconds = %(backoff_base_seconds)s, backoff_cap_seconds = %(backoff_cap_seconds)s,
        atomic = %(atomic)s, updated_at = now()
    FROM retry
    WHERE j.id = retry.id AND j.state = 'pending'
    RETURNING j.id, j.due_at, false AS inserted
), new_jobs AS (
    -- include: options_as_new_job
    WHERE NOT EXISTS (SELECT 1 FROM retry)
), upserted AS (
    -- include: insert_into_jobs
    ON CONFLICT ((coalesce(owner_id, 0)), key)
        WHERE key IS NOT NULL AND ((attempts = 0 AND state = 'pending')
                                   OR (attempts = 1 AND state = 'claimed'))
    DO UPDATE
        SET kind = EXCLUDED.kind, payload = EXCLUDED.payload, due_at = EXCLUDED.due_at,
            state = 'pending', token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
            attempts = 0, max_attempts = EXCLUDED.max_attempts, lease_seconds = EXCLUDED.lease_seconds,
            priority = EXCLUDED.priority, timeout_seconds = EXCLUDED.timeout_seconds,
            backoff_base_seconds = EXCLUDED.backoff_base_seconds, backoff_cap_seconds = EXCLUDED.backoff_cap_seconds,
            atomic = EXCLUDED.atomic, updated_at = now()
    RETURNING id, due_at, (xmax = 0) AS inserted
)
SELECT id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8 AS in_seconds, inserted, 'pending' AS state
FROM moved
UNION ALL
SELECT id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8, inserted, 'pending' FROM upserted;

-- name: upsert_job_keep
-- on_conflict="keep" and "error": the key's waiting job (found as in upsert_job_replace: the
-- index's first-attempt waiting job by ON CONFLICT, else the newest pending retry) is returned
-- unchanged and locked; with none (the key is free, or only a running job holds it) a new row is
-- inserted. The no-op DO UPDATE exists so the one statement returns the waiting job's row instead
-- of nothing: no second look-up that could find it gone or a stranger's.
WITH retry AS (
    SELECT r.id, r.due_at, r.state FROM scheduling_scheduledjob AS r
    WHERE coalesce(r.owner_id, 0) = coalesce(%(owner_id)s::integer, 0) AND r.key = %(key)s
      AND r.state = 'pending' AND r.attempts > 0
      AND NOT EXISTS (
          SELECT 1 FROM scheduling_scheduledjob AS w
          WHERE coalesce(w.owner_id, 0) = coalesce(%(owner_id)s::integer, 0) AND w.key = %(key)s
            AND ((w.state = 'pending' AND w.attempts = 0) OR (w.state = 'claimed' AND w.attempts = 1)))
    ORDER BY r.id DESC
    LIMIT 1
    FOR UPDATE OF r
), new_jobs AS (
    -- include: options_as_new_job
    WHERE NOT EXISTS (SELECT 1 FROM retry)
), upserted AS (
    -- include: insert_into_jobs
    ON CONFLICT ((coalesce(owner_id, 0)), key)
        WHERE key IS NOT NULL AND ((attempts = 0 AND state = 'pending')
                                   OR (attempts = 1 AND state = 'claimed'))
    DO UPDATE SET key = scheduling_scheduledjob.key
    RETURNING id, due_at, (xmax = 0) AS inserted, state
)
SELECT id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8 AS in_seconds, false AS inserted, state
FROM retry
UNION ALL
SELECT id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8, inserted, state FROM upserted;

-- name: live_job_by_key
-- The owner's (NULL: the system's) job for a key, for cancel and reschedule by key: its newest
-- pending job, else its newest claimed one (to name the state that refuses the change). A running
-- job and a waiting successor may coexist; the successor is the key's job.
SELECT id, state FROM scheduling_scheduledjob
WHERE coalesce(owner_id, 0) = coalesce(%(owner_id)s::integer, 0) AND key = %(key)s
  AND key IS NOT NULL AND state IN ('pending', 'claimed', 'running')
ORDER BY state = 'pending' DESC, id DESC
LIMIT 1;

-- name: job_state
SELECT state FROM scheduling_scheduledjob WHERE id = %(id)s;

-- name: job_states
SELECT id, state FROM scheduling_scheduledjob WHERE id = ANY(%(ids)s::bigint[]);

-- name: cancel_job
UPDATE scheduling_scheduledjob
SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = %(id)s AND state = 'pending'
RETURNING id;

-- name: cancel_jobs
-- Bulk cancel (api.cancel_many): only pending rows change; the caller reports the rest.
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
RETURNING id, due_at, extract(epoch FROM due_at - now())::float8 AS in_seconds;

-- name: run_jobs_now
UPDATE scheduling_scheduledjob
SET due_at = now(), updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
RETURNING id;

-- name: retry_dead_jobs
-- A dead job gets a fresh attempts budget and is due now, which makes it its key's waiting job.
-- It stays dead while its key already has a waiting job (pending, or claimed and not started) and
-- when a newer dead job of the same key is retried in the same statement: the NOT EXISTS and the
-- max(id) keep the partial unique index happy. A running job does not hold the key back.
-- A recurrence's occurrence likewise stays dead while the recurrence has a live occurrence (or a
-- newer dead one of it is retried here): one live occurrence per recurrence, an index too.
-- A job with a uniqueness window leaves it when dead does not hold it (another may hold it by now).
-- A deleted owner's job (former_owner set) stays dead: it never returns to pending (its key would
-- then be the system's, owner_id being NULL: a system schedule() of that key met the user's job).
-- An occurrence comes back retired while its recurrence is not active (an operator's choice to run it
-- once: given back, it is cancelled, as when the pause found it running).
UPDATE scheduling_scheduledjob AS j
SET state = 'pending', attempts = 0, due_at = now(), finished_at = NULL, token = NULL, claimed_at = NULL,
    heartbeat_at = NULL, claimed_by = '', updated_at = now(),
    retired = j.recurrence_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM scheduling_recurrence AS r WHERE r.id = j.recurrence_id AND r.state = 'active'),
    unique_key = CASE WHEN 'dead' = ANY(j.unique_states) THEN j.unique_key END
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'dead' AND j.former_owner = ''
  AND (j.recurrence_id IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM scheduling_scheduledjob AS o
            WHERE o.recurrence_id = j.recurrence_id AND NOT (o.state IN ('done', 'cancelled', 'dead')))
        AND j.id = (
            SELECT max(d.id) FROM scheduling_scheduledjob AS d
            WHERE d.id = ANY(%(ids)s::bigint[]) AND d.state = 'dead' AND d.recurrence_id = j.recurrence_id)))
  AND (j.key IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM scheduling_scheduledjob AS o
            WHERE coalesce(o.owner_id, 0) = coalesce(j.owner_id, 0) AND o.key = j.key
              AND o.state IN ('pending', 'claimed'))
        AND j.id = (
            SELECT max(d.id) FROM scheduling_scheduledjob AS d
            WHERE d.id = ANY(%(ids)s::bigint[]) AND d.state = 'dead'
              AND coalesce(d.owner_id, 0) = coalesce(j.owner_id, 0) AND d.key = j.key)))
RETURNING j.id;

-- name: unique_slot
-- Uniqueness windows: the slot of the database clock's present, counted in windows of `window`
-- seconds from the epoch (River's and Oban's periods: a window is a fixed slot, not a sliding span).
SELECT floor(extract(epoch FROM clock_timestamp()) / %(window)s)::bigint AS slot;

-- name: insert_unique_job
-- A job with a uniqueness window: inserted unless a row holds the same unique_key (kind, owner,
-- key or payload, window slot) in one of that row's unique_states. The unique index
-- scheduledjob_unique_window_uniq decides, so two callers racing cannot both insert: the second
-- waits for the first to commit (or roll back) and then inserts nothing. DO NOTHING without a
-- target also yields to the key's waiting job (scheduledjob_waiting_owner_key_uniq), which the
-- caller then meets through the key's own rule. No row is locked or waited for beyond that insert.
WITH new_jobs AS (
    -- include: options_as_new_job
)
-- include: insert_into_jobs
ON CONFLICT DO NOTHING
RETURNING id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8 AS in_seconds;

-- name: unique_job_holder
-- The job holding a unique key (in one of its own unique_states), through the unique index.
SELECT id, state FROM scheduling_scheduledjob
WHERE unique_key = %(unique_key)s AND state = ANY(unique_states)
LIMIT 1;

-- name: replace_unique_job
-- on_conflict="replace" within a window: the holder is moved (payload, due time, budget, its own
-- options) while it waits (pending); a job claimed, running or finished is left as it is.
UPDATE scheduling_scheduledjob
SET payload = %(payload)s::jsonb,
    due_at = coalesce(%(due_at)s, CASE WHEN %(delay)s > 0 THEN clock_timestamp() + make_interval(secs => %(delay)s) ELSE now() END),
    max_attempts = greatest(%(max_attempts)s, attempts + 1), priority = %(priority)s,
    timeout_seconds = %(timeout_seconds)s, backoff_base_seconds = %(backoff_base_seconds)s,
    backoff_cap_seconds = %(backoff_cap_seconds)s, atomic = %(atomic)s, updated_at = now()
WHERE id = %(id)s AND state = 'pending' AND unique_key = %(unique_key)s
RETURNING id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8 AS in_seconds;
