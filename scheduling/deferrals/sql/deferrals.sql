-- Broker deferrals: the one table write they make. Loaded once by scheduling.deferrals.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: record_dead_deferral
-- A broker deferral whose attempts are spent becomes a dead row, so a person sees it in the admin
-- beside every other dead job (and can retry it there: it then runs as a row). Keyed
-- broker:<deferral id>; a redelivery of the same last attempt finds the row and adds no second one
-- (the kind, state index finds it).
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
     claimed_by, created_at, updated_at, finished_at)
SELECT %(kind)s, %(payload)s::jsonb, coalesce(%(due_at)s, now()), 'dead', %(lease_seconds)s, %(attempts)s,
       %(attempts)s, %(error)s, %(key)s, NULL, '', now(), now(), now()
WHERE NOT EXISTS (
    SELECT 1 FROM scheduling_scheduledjob WHERE kind = %(kind)s AND state = 'dead' AND key = %(key)s)
RETURNING id;
