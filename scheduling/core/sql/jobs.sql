-- Parts of statements the mechanisms share, written once here (core/db.py includes them where a
-- statement says `-- include: <name>`). Loaded once by scheduling.core.db.

-- part: insert_into_jobs
-- The one INSERT into the jobs table. Every door that adds a job includes it: due_at's schedule
-- (insert_job, insert_jobs, insert_unique_job, upsert_job_replace, upsert_job_keep; schedule_many, the Tasks backend and
-- TimekeeperTask reach them through scheduling.api), the recurring planner (plan_occurrences) and the
-- broker deferrals' dead rows (record_dead_deferral). The including statement defines `new_jobs`
-- (a CTE with these columns, typed by casts: each job's resolved options, due_at.store's
-- ValidOptions or a recurrence's; unique_key and unique_states NULL unless a uniqueness window
-- applies) and follows the part with its conflict clause and RETURNING. What
-- every new job starts with (no claim, created and updated now) is written here only.
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
     claimed_by, created_at, updated_at, finished_at, priority, timeout_seconds, backoff_base_seconds,
     backoff_cap_seconds, atomic, recurrence_id, occurrence_at, unique_key, unique_states)
SELECT n.kind, n.payload, n.due_at, n.state, n.lease_seconds, n.attempts, n.max_attempts, n.last_error,
       n.key, n.owner_id, '', now(), now(), n.finished_at, n.priority, n.timeout_seconds,
       n.backoff_base_seconds, n.backoff_cap_seconds, n.atomic, n.recurrence_id, n.occurrence_at,
       n.unique_key, n.unique_states
FROM new_jobs AS n

-- part: options_as_new_job
-- One new pending job from a door's resolved options (core/options.py, ValidOptions.params(), with
-- the kind and the payload as JSON text): the SELECT a `new_jobs` CTE holds for insert_into_jobs. A
-- delay counts from the call (clock_timestamp()), not from the start of the caller's transaction
-- (now()). A delay of 0 is "due at once": now(), so that a claim in the same transaction (a
-- TestCase) sees it due too.
SELECT %(kind)s::text AS kind, %(payload)s::jsonb AS payload,
       coalesce(%(due_at)s::timestamptz,
                CASE WHEN %(delay)s > 0 THEN clock_timestamp() + make_interval(secs => %(delay)s) ELSE now() END)
           AS due_at,
       'pending'::text AS state, %(lease_seconds)s::integer AS lease_seconds, 0 AS attempts,
       %(max_attempts)s::integer AS max_attempts, ''::text AS last_error, %(key)s::text AS key,
       %(owner_id)s::integer AS owner_id, NULL::timestamptz AS finished_at, %(priority)s::integer AS priority,
       %(timeout_seconds)s::float8 AS timeout_seconds, %(backoff_base_seconds)s::float8 AS backoff_base_seconds,
       %(backoff_cap_seconds)s::float8 AS backoff_cap_seconds, %(atomic)s::boolean AS atomic,
       NULL::bigint AS recurrence_id, NULL::timestamptz AS occurrence_at,
       %(unique_key)s::text AS unique_key, %(unique_states)s::varchar[] AS unique_states
