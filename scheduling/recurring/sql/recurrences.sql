-- Recurrences (scheduling.recurring): recurring per-entity work as rows, run as due_at occurrences.
-- Loaded once by scheduling.recurring.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: insert_recurrence
-- One recurrence; its key is unique per owner (coalesce(owner_id, 0), as for jobs). No row back:
-- the key is taken, and the caller applies on_conflict to the existing one.
INSERT INTO scheduling_recurrence
    (kind, payload, key, owner_id, expression, every_seconds, timezone, dst_gap, missed, starts_at, ends_at,
     anchor_at, state, priority, max_attempts, current_at, current_job_id, created_at, updated_at, paused_reason,
     recheck_access)
VALUES (%(kind)s, %(payload)s::jsonb, %(key)s, %(owner_id)s, %(expression)s, %(every_seconds)s, %(timezone)s,
        %(dst_gap)s, %(missed)s, %(starts_at)s, %(ends_at)s, coalesce(%(anchor_at)s, now()), 'active',
        %(priority)s, %(max_attempts)s, NULL, NULL, now(), now(), '', %(recheck_access)s)
ON CONFLICT ((coalesce(owner_id, 0)), key) DO NOTHING
RETURNING id;

-- name: insert_recurrences
-- Bulk create (recur_many): one statement for many keys of one kind and rule; keys already taken
-- are left alone and not returned.
INSERT INTO scheduling_recurrence
    (kind, payload, key, owner_id, expression, every_seconds, timezone, dst_gap, missed, starts_at, ends_at,
     anchor_at, state, priority, max_attempts, current_at, current_job_id, created_at, updated_at, paused_reason,
     recheck_access)
SELECT %(kind)s, t.payload::jsonb, t.key, t.owner_id, %(expression)s, %(every_seconds)s, t.timezone,
       %(dst_gap)s, %(missed)s, %(starts_at)s, %(ends_at)s, coalesce(%(anchor_at)s, now()), 'active',
       %(priority)s, %(max_attempts)s, NULL, NULL, now(), now(), '', %(recheck_access)s
FROM unnest(%(payloads)s::text[], %(keys)s::text[], %(owner_ids)s::bigint[], %(timezones)s::text[])
     AS t(payload, key, owner_id, timezone)
ON CONFLICT ((coalesce(owner_id, 0)), key) DO NOTHING
RETURNING id, key, owner_id, timezone;

-- name: lock_recurrence
-- The recurrence's row, locked: every write of its occurrences (api and planner) holds this lock,
-- so they happen one after the other. `current_state` is its latest occurrence's job state.
SELECT r.id, r.kind, r.payload, r.key, r.owner_id, r.expression, r.every_seconds, r.timezone, r.dst_gap,
       r.missed, r.starts_at, r.ends_at, r.anchor_at, r.state, r.priority, r.max_attempts, r.current_at,
       r.current_job_id, j.state AS current_state, r.recheck_access
FROM scheduling_recurrence AS r
LEFT JOIN scheduling_scheduledjob AS j ON j.id = r.current_job_id
WHERE r.id = %(id)s
FOR UPDATE OF r;

-- name: recurrence_id_by_key
SELECT id FROM scheduling_recurrence WHERE coalesce(owner_id, 0) = coalesce(%(owner_id)s, 0) AND key = %(key)s;

-- name: update_recurrence_rule
-- A change of rule, payload or policy (api.change_recurrence), under the row lock taken before.
UPDATE scheduling_recurrence
SET kind = %(kind)s, payload = %(payload)s::jsonb, expression = %(expression)s, every_seconds = %(every_seconds)s,
    timezone = %(timezone)s, dst_gap = %(dst_gap)s, missed = %(missed)s, starts_at = %(starts_at)s,
    ends_at = %(ends_at)s, anchor_at = %(anchor_at)s, priority = %(priority)s, max_attempts = %(max_attempts)s,
    updated_at = now()
WHERE id = %(id)s
RETURNING id;

-- name: last_run_occurrence_at
-- The latest occurrence instant that has run or is running (any attempt made, or a state past
-- pending other than cancelled): a changed or resumed rule plans strictly after it. Walks the
-- unique occurrence index backwards.
SELECT max(occurrence_at) FROM scheduling_scheduledjob
WHERE recurrence_id = %(id)s AND (attempts > 0 OR NOT (state IN ('pending', 'cancelled')));

-- name: move_pending_occurrence
-- The pending occurrence moves to the changed rule's next instant and takes the new payload, kind
-- and the options the (new) kind gives it (lease, attempts budget, priority): one conditional
-- UPDATE, nothing if it has been claimed meanwhile. A retry waiting there is superseded: the row
-- starts over as the next instant's first attempt (attempts 0). Keeping the attempts spent, it read
-- as an occurrence that had run at its new instant (last_run_occurrence_at), so a second change or
-- a resume planned after it and skipped that instant, which also began with an attempt spent.
UPDATE scheduling_scheduledjob AS j
SET occurrence_at = %(occurrence_at)s, due_at = %(due_at)s, payload = r.payload, kind = r.kind,
    lease_seconds = %(lease_seconds)s, attempts = 0, max_attempts = %(max_attempts)s, last_error = '',
    priority = %(priority)s, updated_at = now()
FROM scheduling_recurrence AS r
WHERE r.id = %(id)s AND j.id = r.current_job_id AND j.state = 'pending'
RETURNING j.id, j.due_at, extract(epoch FROM j.due_at - now())::float8 AS in_seconds;

-- name: set_recurrence_current
UPDATE scheduling_recurrence
SET current_at = %(current_at)s, updated_at = now()
WHERE id = %(id)s
RETURNING id;

-- name: set_recurrences_state
-- Pause, resume, cancel or end a selection: only rows in one of `from_states` change (and lose the
-- planner's reason for a pause). Their occurrences are stopped by cancel_pending_occurrences in the
-- same transaction.
UPDATE scheduling_recurrence
SET state = %(state)s, paused_reason = '', updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = ANY(%(from_states)s::text[])
RETURNING id;

-- name: lock_live_occurrences
-- Pause, cancel, end: first the recurrences' unfinished occurrences are locked (a running atomic chunk
-- holds its row until it commits: this waits for it), so the statements after this one, each with a
-- snapshot of its own, see what the chunk left (a snoozed or failed occurrence pending again).
SELECT id FROM scheduling_scheduledjob
WHERE recurrence_id = ANY(%(ids)s::bigint[]) AND NOT (state IN ('done', 'cancelled', 'dead'))
ORDER BY id
FOR UPDATE;

-- name: cancel_pending_occurrences
-- Stop the occurrences of the given recurrences (pause, cancel, end): a pending one, first run or
-- retry alike, is cancelled; a claimed or running one runs on with the attempt it has and no
-- retry (its budget becomes the attempts spent, so a failure makes it dead, not pending again) and
-- is retired (given back without having failed, it is cancelled: due_at/lifecycle.py).
-- Both walk the one-live-occurrence index. Returns the jobs cancelled, which say why in last_error
-- (their page shows it; the audit record of the operator's action names them).
WITH cancelled AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = 'cancelled', finished_at = now(), updated_at = now(), last_error = %(reason)s
    WHERE j.recurrence_id = ANY(%(ids)s::bigint[]) AND j.state = 'pending'
    RETURNING j.id
), last_attempt AS (
    UPDATE scheduling_scheduledjob AS j
    SET max_attempts = CASE WHEN j.attempts >= 1 THEN least(j.max_attempts, j.attempts) ELSE j.max_attempts END,
        retired = true, updated_at = now()
    WHERE j.recurrence_id = ANY(%(ids)s::bigint[]) AND j.state IN ('claimed', 'running')
    RETURNING j.id
)
SELECT id FROM cancelled;

-- name: pause_recurrences_for
-- The planner pauses recurrences it may not plan, each with its reason (shown in the admin and the
-- API), only while still active.
UPDATE scheduling_recurrence AS r
SET state = 'paused', paused_reason = p.reason, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS p(id, reason)
WHERE r.id = p.id AND r.state = 'active'
RETURNING r.id;

-- name: adopt_live_occurrence
-- Resume: a recurrence whose occurrence still runs (claimed before the pause) makes it its latest,
-- so the planner plans the next once it has finished (the one-live-occurrence index allows no other);
-- the occurrence is no longer retired (given back, it is pending again; its budget stays as the pause
-- left it).
WITH adopted AS (
    UPDATE scheduling_recurrence AS r
    SET current_job_id = o.id, current_at = o.occurrence_at, updated_at = now()
    FROM scheduling_scheduledjob AS o
    WHERE r.id = %(id)s AND o.recurrence_id = r.id AND NOT (o.state IN ('done', 'cancelled', 'dead'))
    RETURNING o.id
), unretired AS (
    UPDATE scheduling_scheduledjob AS j SET retired = false, updated_at = now()
    FROM adopted WHERE j.id = adopted.id AND j.retired
)
SELECT id FROM adopted;

-- name: owner_recurrences
-- An owner's recurrences that may still plan (active or paused), counted up to limit + 1 (the
-- quota needs no more; the owner_state index).
SELECT count(*) FROM (SELECT 1 FROM scheduling_recurrence
                      WHERE owner_id = %(owner_id)s AND state IN ('active', 'paused')
                      LIMIT %(limit)s + 1) AS capped;

-- name: recurrence_states
SELECT id, state FROM scheduling_recurrence WHERE id = ANY(%(ids)s::bigint[]);

-- name: pick_recurrences_to_plan
-- The planner's pick (leader only, but safe with two): active recurrences with no live occurrence
-- (their latest is done, dead, cancelled or pruned; a claimed one may yet fail and come back as a
-- retry, so its successor waits). Each probe is one look-up in the one-live-occurrence index
-- (the NOT EXISTS repeats its predicate). The latest instant has passed unless it was run early,
-- so the partial index on current_at bounds the walk to the due ones. SKIP LOCKED: a row an API
-- call or another planner holds is planned on the next pass. Only the kinds this process knows
-- (%(kinds)s): in a rolling deploy an old-release leader leaves a new kind's recurrences, untouched, to
-- a leader that knows it (planner.py).
SELECT r.id, r.kind, r.expression, r.every_seconds, r.timezone, r.dst_gap, r.missed, r.starts_at, r.ends_at,
       r.anchor_at, r.current_at, r.priority, r.max_attempts, r.owner_id, r.recheck_access
FROM scheduling_recurrence AS r
WHERE r.state = 'active' AND r.current_at <= now() AND r.kind = ANY(%(kinds)s::text[])
  AND NOT EXISTS (SELECT 1 FROM scheduling_scheduledjob AS o
                  WHERE o.recurrence_id = r.id AND NOT (o.state IN ('done', 'cancelled', 'dead')))
ORDER BY r.current_at
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED;

-- name: plan_occurrences
-- Create the next occurrence of many recurrences and advance them, in one statement. Each plan
-- row says the instant the caller read as the latest (`prev`, NULL for a new recurrence): the
-- insert happens only while the recurrence still says so, the unique (recurrence, occurrence_at)
-- index refuses an instant that exists and the one-live-occurrence index a second live job (ON
-- CONFLICT DO NOTHING, no target: either), so an occurrence is created at most once and never
-- beside a live one, whatever two planners or an API call do. current_at only moves forward. The
-- INSERT is the core's, shared with every door that adds a job (core/sql/jobs.sql).
WITH plan AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(prevs)s::timestamptz[], %(ats)s::timestamptz[],
                         %(dues)s::timestamptz[], %(leases)s::int[], %(attempts)s::int[], %(priorities)s::int[])
         AS p(id, prev, at, due, lease, attempts, priority)
), new_jobs AS (
    SELECT r.kind::text AS kind, r.payload, p.due AS due_at, 'pending'::text AS state, p.lease AS lease_seconds,
           0 AS attempts, p.attempts AS max_attempts, ''::text AS last_error, NULL::text AS key, r.owner_id,
           NULL::timestamptz AS finished_at, p.priority, NULL::float8 AS timeout_seconds,
           NULL::float8 AS backoff_base_seconds, NULL::float8 AS backoff_cap_seconds, NULL::boolean AS atomic,
           r.id AS recurrence_id, p.at AS occurrence_at, NULL::text AS unique_key, NULL::varchar[] AS unique_states
    FROM plan AS p
    JOIN scheduling_recurrence AS r ON r.id = p.id
    WHERE r.state = 'active' AND r.current_at IS NOT DISTINCT FROM p.prev
      AND (r.current_at IS NULL OR p.at > r.current_at)
), inserted AS (
    -- include: insert_into_jobs
    ON CONFLICT DO NOTHING
    RETURNING id, recurrence_id, occurrence_at, due_at
)
UPDATE scheduling_recurrence AS r
SET current_at = i.occurrence_at, current_job_id = i.id, updated_at = now()
FROM inserted AS i
WHERE r.id = i.recurrence_id
RETURNING r.id AS recurrence_id, i.id AS job_id, i.occurrence_at, i.due_at,
          extract(epoch FROM i.due_at - now())::float8 AS in_seconds;

-- name: end_recurrences
-- Recurrences with no occurrence left before their end: ended (only while still at `prev`).
UPDATE scheduling_recurrence AS r
SET state = 'ended', updated_at = now()
FROM unnest(%(ids)s::bigint[], %(prevs)s::timestamptz[]) AS p(id, prev)
WHERE r.id = p.id AND r.state = 'active' AND r.current_at IS NOT DISTINCT FROM p.prev
RETURNING r.id;
