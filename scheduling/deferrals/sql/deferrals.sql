-- Broker deferrals: the one table write they make. Loaded once by scheduling.deferrals.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: record_dead_deferral
-- A broker deferral whose attempts are spent becomes a dead row, so a person sees it in the admin
-- beside every other dead job (and can retry it there: it then runs as a row). Keyed
-- broker:<deferral id>; a redelivery of the same last attempt finds the row and adds no second one
-- (the kind, state index finds it). The INSERT is the core's (core/sql/jobs.sql).
WITH new_jobs AS (
    SELECT %(kind)s::text AS kind, %(payload)s::jsonb AS payload, coalesce(%(due_at)s::timestamptz, now()) AS due_at,
           'dead'::text AS state, %(lease_seconds)s::integer AS lease_seconds, %(attempts)s::integer AS attempts,
           %(attempts)s::integer AS max_attempts, %(error)s::text AS last_error, %(key)s::text AS key,
           NULL::integer AS owner_id, now() AS finished_at, 0 AS priority, NULL::float8 AS timeout_seconds,
           NULL::float8 AS backoff_base_seconds, NULL::float8 AS backoff_cap_seconds, NULL::boolean AS atomic,
           NULL::bigint AS recurrence_id, NULL::timestamptz AS occurrence_at,
           NULL::text AS unique_key, NULL::varchar[] AS unique_states
    WHERE NOT EXISTS (
        SELECT 1 FROM scheduling_scheduledjob WHERE kind = %(kind)s AND state = 'dead' AND key = %(key)s)
)
-- include: insert_into_jobs
RETURNING id;
