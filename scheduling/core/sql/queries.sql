-- Every hand-written statement Timekeeper runs, by name. Loaded once by scheduling.core.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: insert_job
-- A plain insert; the caller's transaction decides whether it survives. A delay counts from the
-- call (clock_timestamp()), not from the start of the caller's transaction (now()). A delay of 0
-- is "due at once": now(), so that a claim in the same transaction (a TestCase) sees it due too.
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
     claimed_by, created_at, updated_at, priority, timeout_seconds, backoff_base_seconds, backoff_cap_seconds, atomic)
VALUES (%(kind)s, %(payload)s::jsonb, coalesce(%(due_at)s, CASE WHEN %(delay)s > 0 THEN clock_timestamp() + make_interval(secs => %(delay)s) ELSE now() END),
        'pending', %(lease_seconds)s, 0, %(max_attempts)s, '', %(key)s, %(owner_id)s, '', now(), now(), %(priority)s, %(timeout_seconds)s, %(backoff_base_seconds)s, %(backoff_cap_seconds)s, %(atomic)s)
RETURNING id, due_at, extract(epoch FROM due_at - clock_timestamp())::float8 AS in_seconds;

-- name: insert_jobs
-- Bulk insert for schedule_many: one statement for any number of rows of one kind (no keys), in
-- the caller's transaction. The payloads come as one text array; ORDINALITY keeps their order.
-- clock_timestamp() is read once (the scalar subquery), so every row gets the same due time.
INSERT INTO scheduling_scheduledjob
    (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
     claimed_by, created_at, updated_at, priority, timeout_seconds, backoff_base_seconds, backoff_cap_seconds, atomic)
SELECT %(kind)s, t.payload::jsonb,
       coalesce(%(due_at)s, CASE WHEN %(delay)s > 0 THEN (SELECT clock_timestamp()) + make_interval(secs => %(delay)s)
                                 ELSE now() END), 'pending',
       %(lease_seconds)s, 0, %(max_attempts)s, '', NULL, %(owner_id)s, '', now(), now(), %(priority)s,
       %(timeout_seconds)s, %(backoff_base_seconds)s, %(backoff_cap_seconds)s, %(atomic)s
FROM unnest(%(payloads)s::text[]) WITH ORDINALITY AS t(payload, n)
ORDER BY t.n
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
            AND ((w.state = 'pending' AND w.attempts = 0) OR (w.state = 'claimed' AND w.claimed_by = '' AND w.attempts = 1)))
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
), upserted AS (
    INSERT INTO scheduling_scheduledjob
        (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
         claimed_by, created_at, updated_at, priority, timeout_seconds, backoff_base_seconds, backoff_cap_seconds, atomic)
    SELECT %(kind)s, %(payload)s::jsonb, coalesce(%(due_at)s, CASE WHEN %(delay)s > 0 THEN clock_timestamp() + make_interval(secs => %(delay)s) ELSE now() END),
           'pending', %(lease_seconds)s, 0, %(max_attempts)s, '', %(key)s, %(owner_id)s, '', now(), now(), %(priority)s,
           %(timeout_seconds)s, %(backoff_base_seconds)s, %(backoff_cap_seconds)s, %(atomic)s
    WHERE NOT EXISTS (SELECT 1 FROM retry)
    ON CONFLICT ((coalesce(owner_id, 0)), key)
        WHERE key IS NOT NULL AND ((attempts = 0 AND state = 'pending')
                                   OR (attempts = 1 AND claimed_by = '' AND state = 'claimed'))
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
            AND ((w.state = 'pending' AND w.attempts = 0) OR (w.state = 'claimed' AND w.claimed_by = '' AND w.attempts = 1)))
    ORDER BY r.id DESC
    LIMIT 1
    FOR UPDATE OF r
), upserted AS (
    INSERT INTO scheduling_scheduledjob
        (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
         claimed_by, created_at, updated_at, priority, timeout_seconds, backoff_base_seconds, backoff_cap_seconds, atomic)
    SELECT %(kind)s, %(payload)s::jsonb, coalesce(%(due_at)s, CASE WHEN %(delay)s > 0 THEN clock_timestamp() + make_interval(secs => %(delay)s) ELSE now() END),
           'pending', %(lease_seconds)s, 0, %(max_attempts)s, '', %(key)s, %(owner_id)s, '', now(), now(), %(priority)s,
           %(timeout_seconds)s, %(backoff_base_seconds)s, %(backoff_cap_seconds)s, %(atomic)s
    WHERE NOT EXISTS (SELECT 1 FROM retry)
    ON CONFLICT ((coalesce(owner_id, 0)), key)
        WHERE key IS NOT NULL AND ((attempts = 0 AND state = 'pending')
                                   OR (attempts = 1 AND claimed_by = '' AND state = 'claimed'))
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
  AND key IS NOT NULL AND state IN ('pending', 'claimed')
ORDER BY state = 'pending' DESC, id DESC
LIMIT 1;

-- name: database_clock
-- The database clock at this instant (clock_timestamp()), not at the transaction's start (now()):
-- a delay given inside a long transaction counts from the call.
SELECT clock_timestamp() AS now;

-- name: job_owner_id
SELECT owner_id FROM scheduling_scheduledjob WHERE id = %(id)s;

-- name: job_key
SELECT key FROM scheduling_scheduledjob WHERE id = %(id)s;

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
UPDATE scheduling_scheduledjob AS j
SET state = 'pending', attempts = 0, due_at = now(), finished_at = NULL, token = NULL, claimed_at = NULL,
    heartbeat_at = NULL, claimed_by = '', updated_at = now()
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'dead'
  AND (j.key IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM scheduling_scheduledjob AS o
            WHERE coalesce(o.owner_id, 0) = coalesce(j.owner_id, 0) AND o.key = j.key
              AND (o.state = 'pending' OR (o.state = 'claimed' AND o.claimed_by = '')))
        AND j.id = (
            SELECT max(d.id) FROM scheduling_scheduledjob AS d
            WHERE d.id = ANY(%(ids)s::bigint[]) AND d.state = 'dead'
              AND coalesce(d.owner_id, 0) = coalesce(j.owner_id, 0) AND d.key = j.key)))
RETURNING j.id;

-- name: lock_capped_kinds
-- Caps hold exactly under concurrent claimers: before its claim statement, a claim's transaction
-- locks the control row of every capped kind (in kind order, so two claimers never deadlock). A
-- second claimer waits here until the first commits, and its claim statement then starts with a
-- fresh snapshot (READ COMMITTED takes one per statement) that counts the first one's claims. The
-- lock must be its own statement: a count in the statement that takes the lock reads the snapshot
-- taken before the lock was granted, and two overlapping claims would each see the whole room.
-- Without caps nothing is locked and claimers never wait for each other.
SELECT kind FROM scheduling_kindcontrol WHERE max_running IS NOT NULL ORDER BY kind FOR UPDATE;

-- name: claim_due_jobs
-- The claim is one statement so that choosing the rows and claiming them cannot be separated:
-- FOR UPDATE SKIP LOCKED makes concurrent claimers pass over each other's rows instead of waiting,
-- so any number of them get disjoint sets. Each claim gets a new token (fencing): only the holder of
-- the current token can complete or fail the job. heartbeat_at stays NULL: the lease starts when
-- the batch starts (start_jobs), not while it waits in the queue. Run it after lock_capped_kinds,
-- in the same transaction (store.claim_due_jobs does): that is what makes the caps exact.
--
-- Order: higher priority first, then earlier due_at (then id). PostgreSQL has no skip scan, so the
-- priorities (0-9) are walked one at a time, highest first: one branch per priority, each a range
-- scan of a partial index bounded by due_at <= now() ((priority, due_at) for the rare priorities,
-- where the planner's statistics see few rows; due_at for the common one), so the cost follows the
-- rows taken, not the rows pending. Append runs the branches in order and the walk's LIMIT stops it
-- once enough rows are locked. The literal priorities let the planner use each value's statistics.
-- Strict priorities: while more rows of a higher priority are due than a claim takes, lower ones
-- wait (docs/operations.md, "Priorities"); a cap bounds a kind's share.
--
-- Kind controls (scheduling_kindcontrol): a paused kind's rows are left pending. A capped kind
-- (max_running) is not in the walk: its own branch takes at most its room (max_running minus its
-- claimed rows, queued or running) of its most urgent rows, from its range of the (kind, priority,
-- due_at) index. So a capped kind with a backlog takes its room and no more, and the walk fills the
-- claim with other kinds' rows (had its rows been in the walk, they would fill the LIMIT and be
-- dropped by the cap, leaving the claim short and every other kind waiting).
--
-- Batches: the claim takes whole batches, as many as the queue has room for (%(messages)s), in
-- order of urgency. Rows are cut into the batches the claim sends, exactly as claim.batches_for
-- cuts them: per kind, most urgent first, %(batch_sizes)s rows each (1 for a kind not listed), and
-- a run_alone row (its batch died with its process) in a batch of its own. A batch's urgency is its
-- first row's. Batches are kept while the room allows and fewer than %(limit)s rows come before
-- them: a batch_size=1 kind is claimed one row per free message, not %(limit)s rows to give back.
-- Rows locked and not kept are not updated; their locks end with the statement's transaction.
-- The result comes back sorted by urgency (UPDATE ... RETURNING has no order of its own).
WITH controls AS (
    SELECT c.kind, c.paused,
           CASE WHEN c.max_running IS NULL THEN NULL
                ELSE greatest(0, c.max_running - (SELECT count(*) FROM scheduling_scheduledjob AS r
                                                  WHERE r.state = 'claimed' AND r.kind = c.kind)) END AS room
    FROM scheduling_kindcontrol AS c
    WHERE c.paused OR c.max_running IS NOT NULL
), capped AS (
    -- per capped kind with room, the same walk down the priorities in its own range of the
    -- (kind, priority, due_at) index, stopped once its room is locked (rows not yet due are never read)
    SELECT r.* FROM controls AS c
    CROSS JOIN LATERAL (
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 9 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k9
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 8 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k8
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 7 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k7
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 6 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k6
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 5 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k5
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 4 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k4
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 3 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k3
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 2 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k2
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 1 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k1
        UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = c.kind AND priority = 0 AND due_at <= now()
                       ORDER BY due_at LIMIT least(c.room, %(limit)s) FOR UPDATE SKIP LOCKED) AS k0
        LIMIT least(c.room, %(limit)s)
    ) AS r
    WHERE NOT c.paused AND c.room > 0
), walk AS (
    SELECT * FROM (
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 9 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p9
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 8 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p8
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 7 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p7
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 6 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p6
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 5 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p5
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 4 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p4
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 3 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p3
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 2 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p2
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 1 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p1
    UNION ALL
    SELECT * FROM (SELECT id, kind, priority, due_at, run_alone FROM scheduling_scheduledjob
                   WHERE state = 'pending' AND priority = 0 AND due_at <= now()
                     AND kind NOT IN (SELECT kind FROM controls)
                   ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p0
    ) AS by_priority
    LIMIT %(limit)s
), due AS (
    SELECT * FROM capped
    UNION ALL
    SELECT * FROM walk
), sized AS (
    SELECT due.*, coalesce(b.size, 1) AS size,
           CASE WHEN due.run_alone THEN due.id
                ELSE (row_number() OVER (PARTITION BY due.kind, due.run_alone
                                         ORDER BY due.priority DESC, due.due_at, due.id) - 1) / coalesce(b.size, 1)
           END AS batch_no
    FROM due LEFT JOIN unnest(%(kinds)s::text[], %(batch_sizes)s::int[]) AS b(kind, size) ON b.kind = due.kind
), headed AS (
    SELECT sized.id,
           first_value(priority) OVER batch AS head_priority,
           first_value(due_at) OVER batch AS head_due_at,
           first_value(id) OVER batch AS head_id,
           count(*) OVER (PARTITION BY kind, run_alone, batch_no) AS batch_rows
    FROM sized
    WINDOW batch AS (PARTITION BY kind, run_alone, batch_no ORDER BY priority DESC, due_at, id)
), ranked AS (
    SELECT headed.id,
           dense_rank() OVER urgency AS batch_rank,
           count(*) OVER urgency - batch_rows AS rows_before  -- the peers of a row are its batch's rows
    FROM headed
    WINDOW urgency AS (ORDER BY head_priority DESC, head_due_at, head_id)
), allowed AS (
    SELECT id FROM ranked WHERE batch_rank <= %(messages)s AND rows_before < %(limit)s
), claimed AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = 'claimed', token = gen_random_uuid(), claimed_at = now(), heartbeat_at = NULL,
        claimed_by = '', attempts = j.attempts + 1, updated_at = now()
    -- by primary key, row by row: a join would let a high estimate of the capped rows choose a
    -- hash join over the whole table (the ids are few: at most a claim's rows)
    WHERE j.id = ANY(ARRAY(SELECT id FROM allowed))
    RETURNING j.id, j.token::text AS token, j.kind, j.priority, j.due_at, j.run_alone, j.timeout_seconds
)
SELECT id, token, kind, priority, due_at, run_alone, timeout_seconds FROM claimed ORDER BY priority DESC, due_at, id;

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
-- to the sweeper, which records the attempt and counts it against max_attempts. The jobs come
-- back in the message's order (the claim's: most urgent first), which is the order they run in.
WITH started AS (
    UPDATE scheduling_scheduledjob AS j
    SET claimed_by = %(worker)s, heartbeat_at = now()
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) WITH ORDINALITY AS t(id, token, n)
    WHERE j.id = t.id AND j.token = t.token AND j.state = 'claimed' AND j.claimed_by = ''
    RETURNING j.id, j.token::text AS token, j.kind, j.payload, j.attempts, j.max_attempts, j.due_at, t.n,
              j.timeout_seconds, j.backoff_base_seconds, j.backoff_cap_seconds, j.atomic
)
SELECT id, token, kind, payload, attempts, max_attempts, due_at, clock_timestamp() AS db_now,
       timeout_seconds, backoff_base_seconds, backoff_cap_seconds, atomic
FROM started ORDER BY n;

-- name: heartbeat_jobs
-- Renew the lease of the started claims a worker process holds; returns every one still held
-- under its token (a claim not started yet has no lease to renew). Rows locked by the process's own open batch transaction (atomic kinds) are skipped, not
-- waited for: the sweeper cannot take a locked row either, and the batch's commit ends the claim.
WITH mine AS (
    SELECT j.id
    FROM scheduling_scheduledjob AS j
    JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token) ON j.id = t.id AND j.token = t.token
    WHERE j.state = 'claimed' AND j.claimed_by <> ''
), free AS (
    SELECT id FROM scheduling_scheduledjob
    WHERE id IN (SELECT id FROM mine) AND state = 'claimed'
    FOR UPDATE SKIP LOCKED
), renewed AS (
    UPDATE scheduling_scheduledjob AS j
    SET heartbeat_at = clock_timestamp()  -- inside a chunk now() is the chunk's start: already old
    FROM free
    WHERE j.id = free.id
    RETURNING j.id
)
SELECT id FROM mine;

-- name: lock_claims
-- An atomic batch's transaction locks its claims first: only rows still claimed under the token
-- come back, and until the transaction ends no sweeper (SKIP LOCKED) can take them, so the
-- handlers' writes and the outcomes commit together or not at all.
SELECT j.id
FROM scheduling_scheduledjob AS j
JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token) ON j.id = t.id AND j.token = t.token
WHERE j.state = 'claimed'
ORDER BY j.id
FOR UPDATE OF j;

-- name: bound_transaction
-- An atomic chunk's limits (runner.STALL_MARGIN_SECONDS): idle in transaction or one statement for
-- longer than its kinds' longest timeout plus a margin, and PostgreSQL ends the session and its row
-- locks, so a stopped worker cannot hold its claims for ever (the sweeper then takes them back).
-- set_config(..., true) is SET LOCAL: the limits end with the transaction. A stricter limit already
-- in force (the connection's statement_timeout, a server-wide idle limit) is kept, never raised.
SELECT set_config('idle_in_transaction_session_timeout',
                  CASE WHEN t.idle_ms = 0 OR t.idle_ms > %(ms)s::int THEN %(ms)s ELSE t.idle_ms::text END, true),
       set_config('statement_timeout',
                  CASE WHEN t.statement_ms = 0 OR t.statement_ms > %(ms)s::int THEN %(ms)s ELSE t.statement_ms::text END,
                  true)
FROM (SELECT (extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::int
             AS idle_ms,
             (extract(epoch FROM current_setting('statement_timeout')::interval) * 1000)::int AS statement_ms) AS t;

-- name: record_callback_failure
-- An on_commit callback of a committed job failed: say so on that attempt (found by its claim
-- token), so the job page shows it beside the succeeded outcome. Bounded like the error text.
UPDATE scheduling_jobattempt
SET error = left(CASE WHEN error = '' THEN %(error)s ELSE error || E'\n' || %(error)s END, 4000)
WHERE job_id = %(id)s AND token = %(token)s::uuid
RETURNING id;

-- name: unclaim_jobs
-- Claims the claim could not send (no room left in the queue, or the broker did not answer) go
-- back to pending at once, as if never claimed: the attempt the claim counted is given back.
UPDATE scheduling_scheduledjob AS j
SET state = 'pending', token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
    attempts = j.attempts - 1, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token)
WHERE j.id = t.id AND j.token = t.token AND j.state = 'claimed' AND j.claimed_by = ''
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
-- The backoff counts from this statement (clock_timestamp()), not from the transaction's start:
-- inside an atomic chunk now() is when the chunk began, and a job that ran longer than its
-- backoff would be due again the moment the chunk commits.
WITH input AS (
    SELECT t.*, j.due_at AS old_due_at, j.attempts, j.max_attempts, j.claimed_by
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(started)s::timestamptz[], %(finished)s::timestamptz[],
                %(outcomes)s::text[], %(errors)s::text[], %(delays)s::float8[], %(tracebacks)s::text[])
         AS t(id, token, started_at, finished_at, outcome, error, delay, traceback)
    JOIN scheduling_scheduledjob AS j ON j.id = t.id
), failed AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = CASE WHEN input.attempts >= input.max_attempts THEN 'dead' ELSE 'pending' END,
        due_at = CASE WHEN input.attempts >= input.max_attempts THEN j.due_at
                      ELSE clock_timestamp() + make_interval(secs => input.delay) END,
        finished_at = CASE WHEN input.attempts >= input.max_attempts THEN now() END,
        token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
        last_error = input.error, updated_at = now()
    FROM input
    WHERE j.id = input.id AND j.token = input.token AND j.state = 'claimed'
    RETURNING j.id, j.state, j.due_at
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error,
                                       traceback)
    SELECT input.id, input.attempts, input.token, input.claimed_by, input.old_due_at, input.started_at,
           input.finished_at, input.outcome, input.error, input.traceback
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

-- name: release_lost_chunk
-- An atomic chunk lost with its transaction (the idle limit ended a stalled handler, a deadlock, a
-- PostgreSQL restart): nothing of it committed, and nothing says which job was to blame. As the
-- sweeper does for a batch that died together: in a chunk of more than one job each is refunded
-- (max_attempts + 1, the attempt recorded as reclaimed), flagged run_alone (so a culprit's next
-- loss is its own) and due after its kind's backoff (%(delays)s, computed by the caller); a job
-- already run_alone, or alone in its chunk, is charged the attempt (dead when spent), with backoff.
WITH input AS (
    SELECT t.id, t.token, t.delay, j.due_at, j.attempts, j.max_attempts, j.claimed_at, j.claimed_by,
           %(shared)s AND NOT j.run_alone AS shared
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(delays)s::float8[]) AS t(id, token, delay)
    JOIN scheduling_scheduledjob AS j ON j.id = t.id
), released AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = CASE WHEN input.shared OR input.attempts < input.max_attempts THEN 'pending' ELSE 'dead' END,
        finished_at = CASE WHEN NOT (input.shared OR input.attempts < input.max_attempts) THEN clock_timestamp() END,
        max_attempts = j.max_attempts + CASE WHEN input.shared THEN 1 ELSE 0 END,
        run_alone = true,
        due_at = CASE WHEN input.shared OR input.attempts < input.max_attempts
                      THEN clock_timestamp() + make_interval(secs => input.delay) ELSE j.due_at END,
        token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
        last_error = %(reason)s, updated_at = clock_timestamp()
    FROM input
    WHERE j.id = input.id AND j.token = input.token AND j.state = 'claimed'
    RETURNING j.id, j.state, j.due_at, input.shared
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error)
    SELECT input.id, input.attempts, input.token, input.claimed_by, input.due_at, input.claimed_at, clock_timestamp(),
           'reclaimed', %(reason)s
    FROM input JOIN released USING (id)
)
SELECT id, state, due_at, shared FROM released;

-- name: committed_jobs
-- After an ambiguous COMMIT (the connection dropped while committing): the jobs of the chunk that
-- the server did commit: their outcome (succeeded or failed) is recorded under the chunk's claim
-- tokens, which no other holder can write.
SELECT a.job_id, a.outcome = 'succeeded' AS succeeded
FROM scheduling_jobattempt AS a
JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token) ON a.job_id = t.id AND a.token = t.token
WHERE a.outcome <> 'reclaimed';

-- name: check_deferred_constraints
-- An atomic job's deferred constraints (Django creates foreign keys DEFERRABLE INITIALLY DEFERRED)
-- are checked inside the job's savepoint, so a bad reference fails that job, not its chunk's
-- COMMIT; then they are deferred again for the next job.
SET CONSTRAINTS ALL IMMEDIATE;
SET CONSTRAINTS ALL DEFERRED;

-- name: defer_constraints
-- After a job's failed constraint check and its savepoint's rollback: defer again for the next job.
SET CONSTRAINTS ALL DEFERRED;

-- name: sweep_expired_claims
-- The sweeper: started claims whose holder stopped heartbeating for longer than the job's lease
-- (or, with heartbeats off, claims older than sweep_after), and claims never started within a
-- lease whose message is no longer in the queue (lost with the broker), go back to pending, or to
-- dead when their attempts are spent. SKIP LOCKED and a LIMIT keep each statement short.
--
-- Crash isolation. A started claim expires because its process died (or stopped) while running
-- its batch, and nothing says which of the batch's jobs was to blame. So the crash is charged to
-- a job only when it ran alone: flagged run_alone, or the only row of its batch (same holder, same
-- claim) still claimed, the rows before it having finished. The jobs of a batch that died
-- together are charged nothing (the attempt is recorded as reclaimed and max_attempts grows by
-- one: attempt numbers keep counting runs) and are flagged run_alone: the claim sends each in a
-- batch of its own from then on, so a poison job's next crash is its own and it reaches dead by
-- itself, while its siblings keep their budget. A job is refunded at most once (then it runs
-- alone). Started claims taken back are due again after the kind's backoff (%(kinds)s with
-- %(backoff_base)s / %(backoff_cap)s seconds; the defaults for a kind not listed), with the same
-- equal jitter as a failure: a crash is not retried at once. A claim never started ran nothing:
-- it keeps its due time and its attempt is charged as before (a message that is always lost must
-- not loop for ever), and it is not flagged.
-- A batch cut by one statement's LIMIT (rows go batch by batch, oldest claim first) is finished by
-- the next: the sweeper passes the batches it already found shared (%(shared_batches)s, "holder
-- claimed_at"), so the rows left of such a batch are not taken for a batch of one.
WITH stale AS (
    SELECT id, token, kind, attempts, max_attempts, due_at, claimed_at, claimed_by, run_alone,
           backoff_base_seconds, backoff_cap_seconds
    FROM scheduling_scheduledjob
    WHERE state = 'claimed'
      AND CASE WHEN claimed_by <> ''
               -- started: the holder renews heartbeat_at while it runs the job
               THEN CASE WHEN %(heartbeats)s
                         THEN coalesce(heartbeat_at, claimed_at) < now() - make_interval(secs => lease_seconds)
                         ELSE claimed_at < now() - make_interval(secs => %(sweep_after)s) END
               -- not started: its message waits in the queue (covered), or was lost with the broker
               ELSE %(check_unstarted)s AND claimed_at < now() - make_interval(secs => lease_seconds)
                    AND NOT id = ANY(%(covered)s::bigint[]) END
    ORDER BY claimed_at, claimed_by, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), batches AS (
    -- the rows of each started batch still claimed: its unfinished jobs, the culprit among them
    SELECT o.claimed_by, o.claimed_at, count(*) AS size
    FROM scheduling_scheduledjob AS o
    WHERE o.state = 'claimed' AND o.claimed_by <> ''
      AND (o.claimed_by, o.claimed_at) IN (SELECT claimed_by, claimed_at FROM stale WHERE claimed_by <> '')
    GROUP BY o.claimed_by, o.claimed_at
), judged AS (
    SELECT stale.*, s.started, s.shared,
           s.shared OR stale.attempts < stale.max_attempts AS retried,
           CASE WHEN NOT s.started THEN 'claim expired: never started, and its message is no longer queued'
                WHEN s.shared THEN 'claim expired: its process stopped while running a batch of '
                                   || coalesce(batches.size, 1) || ' jobs; not counted against max_attempts, '
                                   || 'the job runs alone next'
                ELSE 'claim expired: the worker stopped heartbeating' END AS error,
           -- the kind's backoff after this attempt, with equal jitter (registry.Backoff.delay)
           -- (the job's own backoff first: schedule(backoff=...))
           least(coalesce(stale.backoff_cap_seconds, b.cap, %(default_backoff_cap)s),
                 coalesce(stale.backoff_base_seconds, b.base, %(default_backoff_base)s)
                 * power(2::float8, least(60, greatest(stale.attempts, 1) - 1)))
               * (0.5 + random() / 2) AS delay
    FROM stale
    LEFT JOIN batches USING (claimed_by, claimed_at)
    LEFT JOIN unnest(%(kinds)s::text[], %(backoff_base)s::float8[], %(backoff_cap)s::float8[])
              AS b(kind, base, cap) ON b.kind = stale.kind
    CROSS JOIN LATERAL (SELECT stale.claimed_by <> '' AS started,
                               stale.claimed_by <> '' AND NOT stale.run_alone
                               AND (coalesce(batches.size, 1) > 1
                                    OR stale.claimed_by || ' ' || stale.claimed_at::text = ANY(%(shared_batches)s::text[]))
                                   AS shared) AS s
), moved AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = CASE WHEN judged.retried THEN 'pending' ELSE 'dead' END,
        finished_at = CASE WHEN NOT judged.retried THEN now() END,
        max_attempts = j.max_attempts + CASE WHEN judged.shared THEN 1 ELSE 0 END,
        run_alone = j.run_alone OR judged.started,
        due_at = CASE WHEN judged.started AND judged.retried THEN now() + make_interval(secs => judged.delay)
                      ELSE j.due_at END,
        token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
        last_error = judged.error, updated_at = now()
    FROM judged
    WHERE j.id = judged.id
    RETURNING j.id, j.state, j.due_at, judged.shared, judged.claimed_by || ' ' || judged.claimed_at::text AS batch
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error)
    SELECT judged.id, judged.attempts, judged.token, judged.claimed_by, judged.due_at, judged.claimed_at, now(),
           'reclaimed', judged.error
    FROM judged JOIN moved USING (id)
)
SELECT id, state, due_at, shared, batch FROM moved;

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
-- One pass over the partial indexes for the numbers operators watch (status, /metrics, /healthz).
-- The pending counts are exact up to exact_limit rows: each counts a LIMITed scan of the partial
-- index, so the query costs the same with a million pending rows as with ten thousand (counting a
-- million index entries takes hundreds of milliseconds, on every scrape). A count that comes back
-- as exact_limit + 1 means "more": store.backlog_status replaces it with the planner's estimate.
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
                             AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused)
                           LIMIT %(exact_limit)s + 1) AS capped) AS backlog,
    (SELECT coalesce(extract(epoch FROM now() - min(due_at)), 0)::float8
       FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
         AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused)) AS oldest_overdue_seconds,
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
                             AND kind IN (SELECT kind FROM scheduling_kindcontrol WHERE paused)
                           LIMIT %(exact_limit)s + 1) AS capped) AS paused,
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending'
                           LIMIT %(exact_limit)s + 1) AS capped) AS pending,
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
                           WHERE state = 'pending' AND due_at > now() AND due_at <= now() + interval '24 hours'
                           LIMIT %(exact_limit)s + 1) AS capped) AS due_next_24h,
    (SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'claimed') AS claimed,
    -- stuck: a claim past its lease (or the stuck limit) that no live transaction holds. A running
    -- atomic chunk locks its rows, so its heartbeat cannot renew them: SKIP LOCKED (FOR KEY SHARE,
    -- the weakest lock, taken for this statement only) leaves those out. Once a stalled chunk's
    -- session is ended (bound_transaction) its rows are free, counted and swept.
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
       WHERE state = 'claimed'
         AND (coalesce(heartbeat_at, claimed_at) < now() - make_interval(secs => lease_seconds)
              OR claimed_at < now() - make_interval(secs => %(stuck_after)s))
       FOR KEY SHARE SKIP LOCKED) AS unheld) AS stuck,
    (SELECT count(*) FROM scheduling_scheduledjob
       WHERE state = 'dead' AND finished_at > now() - interval '24 hours') AS dead_last_24h;

-- name: estimate_backlog
-- Planner estimates (EXPLAIN, from the table statistics) for counts past backlog_status's exact limit.
SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
  AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused);

-- name: estimate_paused
SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
  AND kind IN (SELECT kind FROM scheduling_kindcontrol WHERE paused);

-- name: estimate_pending
SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending';

-- name: estimate_due_next_24h
SELECT 1 FROM scheduling_scheduledjob
WHERE state = 'pending' AND due_at > now() AND due_at <= now() + interval '24 hours';

-- --- Fixed-time schedules ------------------------------------------------------------------------

-- name: insert_schedule_run
-- The exactly-once gate. The unique (schedule, tick) constraint admits the first delivery of a
-- tick; any later one (a second beat, a redelivered message, a re-sent tick) lands in ON CONFLICT,
-- which counts it on the existing row and returns inserted = false (xmax is 0 only for a row this
-- statement inserted). A tick at or before the schedule's pruned_through watermark had its row
-- pruned: no row comes back and the caller refuses it too. Lateness is measured on the database clock.
WITH policy AS (
    SELECT id, pruned_through FROM scheduling_schedulepolicy WHERE id = %(schedule_id)s
)
INSERT INTO scheduling_schedulerun AS r
    (schedule_id, tick, state, trigger, attempt, worker, task_id, started_at, error, duplicates_refused)
SELECT policy.id, coalesce(%(tick)s, now()), 'running', %(trigger)s, 1, %(worker)s, %(task_id)s, now(), '', 0
FROM policy
WHERE policy.pruned_through IS NULL OR coalesce(%(tick)s, now()) > policy.pruned_through
ON CONFLICT (schedule_id, tick) DO UPDATE SET duplicates_refused = r.duplicates_refused + 1
RETURNING r.id, (r.xmax = 0) AS inserted, r.tick, r.state, extract(epoch FROM now() - r.tick)::float8 AS late_seconds;

-- name: finish_schedule_run
-- A run's outcome, recorded only if it is still running: a run marked replaced (or closed as
-- orphaned) meanwhile keeps that state.
UPDATE scheduling_schedulerun
SET state = %(state)s, error = %(error)s, finished_at = now()
WHERE id = %(id)s AND state = 'running'
RETURNING id;

-- name: set_schedule_run_attempt
UPDATE scheduling_schedulerun
SET attempt = %(attempt)s
WHERE id = %(id)s AND state = 'running'
RETURNING id;

-- name: running_schedule_runs
-- Other runs of the schedule still marked running (replace stops them by their Celery task id).
SELECT id, task_id, worker, tick
FROM scheduling_schedulerun
WHERE schedule_id = %(schedule_id)s AND state = 'running' AND id <> %(id)s
ORDER BY tick;

-- name: close_other_running_runs
-- Called by a run that holds the schedule's advisory lock: any other run still marked running
-- cannot be running (it would hold the lock), so its process died or was stopped. Replace marks
-- them 'replaced'; forbid marks them 'failed' with the reason.
UPDATE scheduling_schedulerun
SET state = %(state)s, error = %(error)s, finished_at = now()
WHERE schedule_id = %(schedule_id)s AND state = 'running' AND id <> %(id)s
RETURNING id, tick;

-- name: record_missed_ticks
-- Ticks beat was not there to send in time (or that missed_policy leaves out), recorded as missed
-- so that the history shows them. A tick that already has a row keeps it.
INSERT INTO scheduling_schedulerun
    (schedule_id, tick, state, trigger, attempt, worker, task_id, started_at, finished_at, error, duplicates_refused)
SELECT p.id, t.tick, 'missed', 'beat', 1, '', '', now(), now(), %(error)s, 0
FROM scheduling_schedulepolicy AS p
CROSS JOIN unnest(%(ticks)s::timestamptz[]) AS t(tick)
WHERE p.id = %(schedule_id)s AND (p.pruned_through IS NULL OR t.tick > p.pruned_through)
ON CONFLICT (schedule_id, tick) DO NOTHING
RETURNING tick;

-- name: prune_schedule_runs
-- History limits: keep the latest `successful` succeeded runs and the latest `failed` runs of the
-- other final states; running rows are never pruned. The watermark pruned_through moves to the
-- latest pruned tick, so a late delivery of a pruned tick is still refused by the gate.
WITH ranked AS (
    SELECT id, tick,
           row_number() OVER (PARTITION BY (state = 'succeeded') ORDER BY tick DESC) AS position,
           state = 'succeeded' AS ok
    FROM scheduling_schedulerun
    WHERE schedule_id = %(schedule_id)s AND state <> 'running'
), victims AS (
    DELETE FROM scheduling_schedulerun AS r
    USING ranked
    WHERE r.id = ranked.id
      AND ranked.position > CASE WHEN ranked.ok THEN %(successful)s::int ELSE %(failed)s::int END
    RETURNING r.tick
), watermark AS (
    UPDATE scheduling_schedulepolicy AS p
    SET pruned_through = greatest(p.pruned_through, (SELECT max(tick) FROM victims))
    WHERE p.id = %(schedule_id)s AND EXISTS (SELECT 1 FROM victims)
    RETURNING p.id
)
SELECT count(*) FROM victims;

-- name: advance_last_tick
-- Beat has handled every tick up to `tick` (sent, or recorded as missed). Never moves backwards,
-- so a slow former leader cannot undo a newer one's progress.
UPDATE scheduling_schedulepolicy
SET last_tick = %(tick)s
WHERE id = %(schedule_id)s AND (last_tick IS NULL OR last_tick < %(tick)s)
RETURNING id;

-- name: move_anchor_for_timing
-- Safe edits: when the timing of a schedule changes (expression, zone, interval, DST rule,
-- suspension, enabled), ticks at or before the moment of the change must neither fire nor count as
-- missed, and the next tick of the new timing must. Moving anchor_at forward to that moment does
-- both. Conditional on the stored fingerprint, so it happens once per change whoever notices it.
UPDATE scheduling_schedulepolicy
SET timing_key = %(key)s, anchor_at = greatest(anchor_at, coalesce(%(at)s, now()))
WHERE id = %(schedule_id)s AND timing_key IS DISTINCT FROM %(key)s
RETURNING anchor_at;

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

-- ---------------------------------------------------------------------------------------------------
-- Clocks, locks and leaders.

-- name: database_now
-- The database clock: the only clock that says what is due (beat measures its offset to it).
SELECT now() AS now;

-- name: advisory_lock_held
-- Whether any session holds the advisory lock with this 64-bit key. pg_locks shows a bigint key
-- as classid (its high 32 bits) and objid (its low 32 bits), with objsubid 1. Read on Django's
-- connection: it looks at the lock table, it takes nothing (locks.AdvisoryLock takes them).
SELECT count(*) > 0 AS held
FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND classid = ((%(key)s::bigint >> 32) & 4294967295)::oid
  AND objid = (%(key)s::bigint & 4294967295)::oid;

-- name: record_heartbeat
-- The leading process's sign of life, one row per role, on the database clock. A new leadership
-- (the first heartbeat since this process took the lock) also restarts "leading since", even when
-- the row is left over from an earlier leader.
INSERT INTO scheduling_schedulerheartbeat AS h (role, holder, acquired_at, heartbeat_at)
VALUES (%(role)s, %(holder)s, now(), now())
ON CONFLICT (role) DO UPDATE
SET holder = EXCLUDED.holder, heartbeat_at = now(),
    acquired_at = CASE WHEN %(new_lead)s::boolean THEN now() ELSE h.acquired_at END
RETURNING h.role;

-- ---------------------------------------------------------------------------------------------------
-- Dashboard, /metrics and /healthz: read-only, database clock, bounded to a recent window.

-- name: beat_heartbeat
-- The leading beat's heartbeat and its age by the database clock (no row: no beat ever led).
SELECT holder, acquired_at, heartbeat_at, extract(epoch FROM now() - heartbeat_at)::float8 AS age_seconds
FROM scheduling_schedulerheartbeat
WHERE role = %(role)s;

-- name: attempt_lag_by_minute
-- Due-to-start lag (started_at - due_at, never below 0) of the attempts that started in the last
-- `window` seconds, per minute. Attempts are written when they end, so a job still running is not
-- in it yet. The finished_at bound lets the jobattempt_finished_idx index find the rows.
WITH lags AS (
    SELECT started_at, greatest(extract(epoch FROM started_at - due_at), 0)::float8 AS lag
    FROM scheduling_jobattempt
    WHERE finished_at >= now() - make_interval(secs => %(window)s)
      AND started_at >= now() - make_interval(secs => %(window)s)
)
SELECT date_trunc('minute', started_at) AS minute, count(*) AS attempts,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY lag) AS p95,
       max(lag) AS max
FROM lags
GROUP BY 1
ORDER BY 1;

-- name: attempt_lag_histogram
-- The same lags as a histogram: bucket i holds lags in [bounds[i], bounds[i+1]) (0 below the
-- first bound); the caller makes the buckets cumulative.
WITH lags AS (
    SELECT greatest(extract(epoch FROM started_at - due_at), 0)::float8 AS lag
    FROM scheduling_jobattempt
    WHERE finished_at >= now() - make_interval(secs => %(window)s)
      AND started_at >= now() - make_interval(secs => %(window)s)
)
SELECT width_bucket(lag, %(bounds)s::float8[]) AS bucket, count(*) AS n, sum(lag) AS total
FROM lags
GROUP BY 1
ORDER BY 1;

-- name: backlog_history
-- The backlog (pending and due, not yet claimed) at `points` + 1 instants over the last `window`
-- seconds, rebuilt from row timestamps rather than sampled. A job was waiting from its due time
-- until its attempt started (job_attempt.due_at .. started_at), until it was claimed (claimed
-- rows), until it was cancelled (cancelled rows), or is still waiting (pending and due). Caveats:
-- a reschedule or "run now" overwrites due_at, so a job moved while overdue loses the time it waited
-- before the move; the claim-to-start gap of finished attempts counts as waiting.
-- Each waiting span becomes the range of sample indexes it covers (since <= at < until), summed
-- with a difference array, so the cost is one pass over the spans whatever the number of points.
WITH bounds AS (
    SELECT now() - make_interval(secs => %(window)s) AS t_start,
           %(window)s::float8 / %(points)s AS step, %(points)s::int AS n
), waits AS (
    SELECT a.due_at AS since, coalesce(a.started_at, a.finished_at) AS until
    FROM scheduling_jobattempt AS a, bounds
    WHERE a.finished_at >= bounds.t_start
    UNION ALL
    SELECT j.due_at, j.claimed_at
    FROM scheduling_scheduledjob AS j, bounds
    WHERE j.state = 'claimed' AND j.claimed_at >= bounds.t_start
    UNION ALL
    SELECT j.due_at, now() + interval '1 day'
    FROM scheduling_scheduledjob AS j
    WHERE j.state = 'pending' AND j.due_at <= now()
    UNION ALL
    SELECT j.due_at, j.finished_at
    FROM scheduling_scheduledjob AS j, bounds
    WHERE j.state = 'cancelled' AND j.finished_at >= bounds.t_start AND j.due_at < j.finished_at
), spans AS (
    SELECT greatest(0, ceil(extract(epoch FROM w.since - b.t_start) / b.step))::int AS first_i,
           least(b.n, ceil(extract(epoch FROM w.until - b.t_start) / b.step) - 1)::int AS last_i
    FROM waits AS w, bounds AS b
    WHERE w.until > b.t_start
), deltas AS (
    SELECT i, sum(d) AS d
    FROM (SELECT first_i AS i, 1 AS d FROM spans WHERE first_i <= last_i
          UNION ALL
          SELECT last_i + 1, -1 FROM spans WHERE first_i <= last_i) AS e
    GROUP BY i
)
SELECT b.t_start + make_interval(secs => g.i * b.step) AS at,
       (sum(coalesce(deltas.d, 0)) OVER (ORDER BY g.i))::bigint AS backlog
FROM bounds AS b
CROSS JOIN generate_series(0, b.n) AS g(i)
LEFT JOIN deltas ON deltas.i = g.i
ORDER BY g.i;

-- name: upcoming_jobs
-- Pending jobs due in the next `horizon` seconds, per kind and per hour from now (0 = the next hour).
SELECT kind, floor(extract(epoch FROM due_at - now()) / 3600)::int AS hour, count(*) AS n, min(due_at) AS first_due
FROM scheduling_scheduledjob
WHERE state = 'pending' AND due_at > now() AND due_at <= now() + make_interval(secs => %(horizon)s)
GROUP BY 1, 2
ORDER BY 2, 1;

-- name: attempt_outcomes
-- Attempts that ended in the last `window` seconds, per kind and outcome.
SELECT j.kind, a.outcome, count(*) AS n
FROM scheduling_jobattempt AS a
JOIN scheduling_scheduledjob AS j ON j.id = a.job_id
WHERE a.finished_at >= now() - make_interval(secs => %(window)s)
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: schedule_run_states
-- Fixed-time runs that started in the last `window` seconds, per schedule and state, with each
-- schedule's latest success (kept by the history limits, so it may be older than the window).
SELECT t.name, r.state, count(*) FILTER (WHERE r.started_at >= now() - make_interval(secs => %(window)s)) AS n,
       max(r.finished_at) FILTER (WHERE r.state = 'succeeded') AS last_success
FROM scheduling_schedulerun AS r
JOIN scheduling_schedulepolicy AS p ON p.id = r.schedule_id
JOIN django_celery_beat_periodictask AS t ON t.id = p.periodic_task_id
GROUP BY 1, 2
ORDER BY 1, 2;

-- ---------------------------------------------------------------------------------------------------
-- Kind controls: pause and concurrency caps, read by claim_due_jobs.

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
        WHERE j.state = 'claimed' AND j.kind = c.kind) AS claimed
FROM scheduling_kindcontrol AS c
ORDER BY c.kind;

-- name: kind_breakdown
-- Per kind: due (pending, due time passed), claimed and not started (queued; claimed_by is set by
-- the start), running, and dead in the last 24 h. Each arm of the WHERE is an indexed range (the
-- pending partial index, the claimed partial index, finished_at), so a big history is not read.
SELECT kind,
       count(*) FILTER (WHERE state = 'pending') AS due,
       count(*) FILTER (WHERE state = 'claimed' AND claimed_by = '') AS claimed,
       count(*) FILTER (WHERE state = 'claimed' AND claimed_by <> '') AS running,
       count(*) FILTER (WHERE state = 'dead') AS dead_24h
FROM scheduling_scheduledjob
WHERE (state = 'pending' AND due_at <= now())
   OR state = 'claimed'
   OR (state = 'dead' AND finished_at > now() - interval '24 hours')
GROUP BY kind
ORDER BY kind;

-- name: attempt_lag_buckets
-- Due-to-start lag (started_at - due_at, never below 0) of the attempts that started in the last
-- `window` seconds, per `bucket` seconds (date_bin from the epoch), with p50, p99 and max; the row
-- whose bucket is NULL is the whole window (its p99 is where the dashboard clips its axis). The
-- finished_at bound lets jobattempt_finished_idx find the rows.
WITH lags AS (
    SELECT started_at, greatest(extract(epoch FROM started_at - due_at), 0)::float8 AS lag
    FROM scheduling_jobattempt
    WHERE finished_at >= now() - make_interval(secs => %(window)s)
      AND started_at >= now() - make_interval(secs => %(window)s)
)
SELECT date_bin(make_interval(secs => %(bucket)s), started_at, timestamptz '1970-01-01 00:00:00+00') AS bucket,
       count(*) AS attempts,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
       max(lag) AS max
FROM lags
GROUP BY GROUPING SETS ((1), ())
ORDER BY 1 NULLS FIRST;

-- name: waiting_history
-- What was waiting at `points` + 1 instants over the last `window` seconds, rebuilt from row
-- timestamps like backlog_history, in two series: `waiting` (due and not started: pending, or
-- claimed and not yet started by a worker) and `paused` (due, pending, of a kind paused now).
-- A claim still not started keeps waiting until now; a started claim waited until its claim (its
-- start time is not stored before its attempt is written). Pausing is read as it is now: a kind
-- paused a minute ago shows its earlier wait as paused too.
WITH bounds AS (
    SELECT now() - make_interval(secs => %(window)s) AS t_start,
           %(window)s::float8 / %(points)s AS step, %(points)s::int AS n
), paused AS (
    SELECT kind FROM scheduling_kindcontrol WHERE paused
), waits AS (
    SELECT 'w' AS series, a.due_at AS since, coalesce(a.started_at, a.finished_at) AS until
    FROM scheduling_jobattempt AS a, bounds
    WHERE a.finished_at >= bounds.t_start
    UNION ALL
    SELECT 'w', j.due_at, CASE WHEN j.claimed_by = '' THEN now() + interval '1 day' ELSE j.claimed_at END
    FROM scheduling_scheduledjob AS j, bounds
    WHERE j.state = 'claimed' AND (j.claimed_by = '' OR j.claimed_at >= bounds.t_start)
    UNION ALL
    SELECT CASE WHEN j.kind IN (SELECT kind FROM paused) THEN 'p' ELSE 'w' END, j.due_at, now() + interval '1 day'
    FROM scheduling_scheduledjob AS j
    WHERE j.state = 'pending' AND j.due_at <= now()
    UNION ALL
    SELECT 'w', j.due_at, j.finished_at
    FROM scheduling_scheduledjob AS j, bounds
    WHERE j.state = 'cancelled' AND j.finished_at >= bounds.t_start AND j.due_at < j.finished_at
), spans AS (
    SELECT w.series,
           greatest(0, ceil(extract(epoch FROM w.since - b.t_start) / b.step))::int AS first_i,
           least(b.n, ceil(extract(epoch FROM w.until - b.t_start) / b.step) - 1)::int AS last_i
    FROM waits AS w, bounds AS b
    WHERE w.until > b.t_start
), deltas AS (
    SELECT i,
           sum(d) FILTER (WHERE series = 'w') AS dw,
           sum(d) FILTER (WHERE series = 'p') AS dp
    FROM (SELECT series, first_i AS i, 1 AS d FROM spans WHERE first_i <= last_i
          UNION ALL
          SELECT series, last_i + 1, -1 FROM spans WHERE first_i <= last_i) AS e
    GROUP BY i
)
SELECT b.t_start + make_interval(secs => g.i * b.step) AS at,
       (sum(coalesce(deltas.dw, 0)) OVER (ORDER BY g.i))::bigint AS waiting,
       (sum(coalesce(deltas.dp, 0)) OVER (ORDER BY g.i))::bigint AS paused
FROM bounds AS b
CROSS JOIN generate_series(0, b.n) AS g(i)
LEFT JOIN deltas ON deltas.i = g.i
ORDER BY g.i;

-- --- Web doors: the JSON API's limits and the health backlog ---------------------------------------

-- name: take_create_allowance
-- One job creation by an owner through the JSON API, against their bucket (GCRA) on the database
-- clock. full_at is when the owner's burst is whole again: a creation moves it one emission
-- interval (1/rate seconds) on from max(full_at, now()), and is allowed while that stays within
-- the window (burst/rate seconds) of now(). The upsert locks the owner's row, so concurrent
-- requests of one owner, in any web process, are judged one after the other; a refused creation
-- changes nothing. retry_after_seconds: how long until one would be allowed (read from the row as
-- the statement's snapshot saw it; the caller rounds up to at least one second).
WITH taken AS (
    INSERT INTO scheduling_apiratebucket AS b (owner_id, full_at)
    VALUES (%(owner_id)s, now() + make_interval(secs => %(emission)s))
    ON CONFLICT (owner_id) DO UPDATE
    SET full_at = greatest(b.full_at, now()) + make_interval(secs => %(emission)s)
    WHERE greatest(b.full_at, now()) + make_interval(secs => %(emission)s)
          <= now() + make_interval(secs => %(window)s)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM taken) AS allowed,
       coalesce((SELECT extract(epoch FROM greatest(full_at, now()) + make_interval(secs => %(emission)s)
                                         - now() - make_interval(secs => %(window)s))::float8
                 FROM scheduling_apiratebucket WHERE owner_id = %(owner_id)s), 0)::float8 AS retry_after_seconds;

-- name: lock_owner_creations
-- Serialises one owner's JSON API creations until the transaction ends, so that the pending-jobs
-- quota counted after an insert cannot be raced past by the owner's other requests.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: owner_pending_jobs
-- An owner's pending jobs, counted up to limit + 1 (the quota needs no more; the owner_state
-- index), and how soon the earliest of them but new_id (the job just inserted, which a refusal
-- rolls back) is due, in seconds from now by the database clock (clock_timestamp: delays count from
-- the call, so a job due in 600 s is due in 600 s, not 600 s and a little; 0: overdue).
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
                           WHERE owner_id = %(owner_id)s AND state = 'pending'
                           LIMIT %(limit)s + 1) AS capped) AS pending,
    (SELECT coalesce(greatest(extract(epoch FROM min(due_at) - clock_timestamp()), 0), 0)::float8
       FROM scheduling_scheduledjob
      WHERE owner_id = %(owner_id)s AND state = 'pending' AND id <> %(new_id)s) AS next_due_in_seconds;

-- name: health_backlog
-- The backlog /healthz judges: pending, overdue jobs that are the system's own (no owner: scheduled
-- by code) or of a kind flagged critical, outside paused kinds, counted up to limit + 1 like
-- backlog_status. Other owners' jobs of other kinds are not counted, so no caller of the API can
-- flip the health check (status() and /metrics still count every job).
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
                           WHERE state = 'pending' AND due_at <= now()
                             AND (owner_id IS NULL OR kind = ANY(%(critical)s::text[]))
                             AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused)
                           LIMIT %(limit)s + 1) AS capped) AS backlog,
    (SELECT coalesce(extract(epoch FROM now() - min(due_at)), 0)::float8
       FROM scheduling_scheduledjob
      WHERE state = 'pending' AND due_at <= now()
        AND (owner_id IS NULL OR kind = ANY(%(critical)s::text[]))
        AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused)) AS oldest_overdue_seconds;

-- --- Outcome counters (migration 0015's triggers keep them) -----------------------------------------

-- name: outcome_counters
-- The monotonic outcome counters (/metrics' *_total), kept by the triggers of migration 0015 in
-- the transactions that record the outcomes; the pruner's deletes never lower them.
SELECT metric, label, outcome, value
FROM scheduling_outcomecounter
ORDER BY metric, label, outcome;

-- =================================================================================================
-- Recurrences (scheduling.recurring): recurring per-entity work as rows, run as due_at occurrences.
-- =================================================================================================

-- name: insert_recurrence
-- One recurrence; its key is unique per owner (coalesce(owner_id, 0), as for jobs). No row back:
-- the key is taken, and the caller applies on_conflict to the existing one.
INSERT INTO scheduling_recurrence
    (kind, payload, key, owner_id, expression, every_seconds, timezone, dst_gap, missed, starts_at, ends_at,
     anchor_at, state, priority, max_attempts, current_at, current_job_id, created_at, updated_at)
VALUES (%(kind)s, %(payload)s::jsonb, %(key)s, %(owner_id)s, %(expression)s, %(every_seconds)s, %(timezone)s,
        %(dst_gap)s, %(missed)s, %(starts_at)s, %(ends_at)s, coalesce(%(anchor_at)s, now()), 'active',
        %(priority)s, %(max_attempts)s, NULL, NULL, now(), now())
ON CONFLICT ((coalesce(owner_id, 0)), key) DO NOTHING
RETURNING id;

-- name: insert_recurrences
-- Bulk create (recur_many): one statement for many keys of one kind and rule; keys already taken
-- are left alone and not returned.
INSERT INTO scheduling_recurrence
    (kind, payload, key, owner_id, expression, every_seconds, timezone, dst_gap, missed, starts_at, ends_at,
     anchor_at, state, priority, max_attempts, current_at, current_job_id, created_at, updated_at)
SELECT %(kind)s, t.payload::jsonb, t.key, t.owner_id, %(expression)s, %(every_seconds)s, t.timezone,
       %(dst_gap)s, %(missed)s, %(starts_at)s, %(ends_at)s, coalesce(%(anchor_at)s, now()), 'active',
       %(priority)s, %(max_attempts)s, NULL, NULL, now(), now()
FROM unnest(%(payloads)s::text[], %(keys)s::text[], %(owner_ids)s::bigint[], %(timezones)s::text[])
     AS t(payload, key, owner_id, timezone)
ON CONFLICT ((coalesce(owner_id, 0)), key) DO NOTHING
RETURNING id, key, owner_id, timezone;

-- name: lock_recurrence
-- The recurrence's row, locked: every write of its occurrences (api and planner) holds this lock,
-- so they happen one after the other. `current_state` is its latest occurrence's job state.
SELECT r.id, r.kind, r.payload, r.key, r.owner_id, r.expression, r.every_seconds, r.timezone, r.dst_gap,
       r.missed, r.starts_at, r.ends_at, r.anchor_at, r.state, r.priority, r.max_attempts, r.current_at,
       r.current_job_id, j.state AS current_state
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
-- The latest occurrence instant that left pending (claimed, done, dead; cancelled ones never ran):
-- a changed or resumed rule plans strictly after it. Walks the unique occurrence index backwards.
SELECT max(occurrence_at) FROM scheduling_scheduledjob
WHERE recurrence_id = %(id)s AND state IN ('claimed', 'done', 'dead');

-- name: move_pending_occurrence
-- The pending occurrence moves to the changed rule's next instant (and takes the new payload):
-- one conditional UPDATE, nothing if it has been claimed meanwhile.
UPDATE scheduling_scheduledjob AS j
SET occurrence_at = %(occurrence_at)s, due_at = %(due_at)s, payload = r.payload, kind = r.kind,
    updated_at = now()
FROM scheduling_recurrence AS r
WHERE r.id = %(id)s AND j.id = r.current_job_id AND j.state = 'pending'
RETURNING j.id, j.due_at, extract(epoch FROM j.due_at - now())::float8 AS in_seconds;

-- name: set_recurrence_current
UPDATE scheduling_recurrence
SET current_at = %(current_at)s, updated_at = now()
WHERE id = %(id)s
RETURNING id;

-- name: set_recurrences_state
-- Pause, resume, cancel or end a selection: only rows in one of `from_states` change. Their
-- pending occurrence (if any) is cancelled by cancel_pending_occurrences in the same transaction.
UPDATE scheduling_recurrence
SET state = %(state)s, updated_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = ANY(%(from_states)s::text[])
RETURNING id;

-- name: cancel_pending_occurrences
-- The pending occurrences of the given recurrences are cancelled (a claimed one runs on).
UPDATE scheduling_scheduledjob AS j
SET state = 'cancelled', finished_at = now(), updated_at = now()
FROM scheduling_recurrence AS r
WHERE r.id = ANY(%(ids)s::bigint[]) AND j.id = r.current_job_id AND j.state = 'pending'
RETURNING j.id;

-- name: recurrence_states
SELECT id, state FROM scheduling_recurrence WHERE id = ANY(%(ids)s::bigint[]);

-- name: pick_recurrences_to_plan
-- The planner's pick (leader only, but safe with two): active recurrences whose latest occurrence
-- has left pending (claimed, finished, cancelled by hand, or pruned). Its occurrence instant has
-- passed unless it was run early, so the partial index on current_at bounds the walk to the due
-- ones. SKIP LOCKED: a row an API call or another planner holds is planned on the next pass.
SELECT r.id, r.kind, r.expression, r.every_seconds, r.timezone, r.dst_gap, r.missed, r.starts_at, r.ends_at,
       r.anchor_at, r.current_at, r.priority, r.max_attempts
FROM scheduling_recurrence AS r
LEFT JOIN scheduling_scheduledjob AS j ON j.id = r.current_job_id
WHERE r.state = 'active' AND r.current_at <= now() AND (j.id IS NULL OR j.state <> 'pending')
ORDER BY r.current_at
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED;

-- name: plan_occurrences
-- Create the next occurrence of many recurrences and advance them, in one statement. Each plan
-- row says the instant the caller read as the latest (`prev`, NULL for a new recurrence): the
-- insert happens only while the recurrence still says so, and the unique (recurrence,
-- occurrence_at) index refuses an instant that exists (ON CONFLICT DO NOTHING), so an occurrence
-- is created at most once whatever two planners or an API call do. current_at only moves forward.
WITH plan AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(prevs)s::timestamptz[], %(ats)s::timestamptz[],
                         %(dues)s::timestamptz[], %(leases)s::int[], %(attempts)s::int[], %(priorities)s::int[])
         AS p(id, prev, at, due, lease, attempts, priority)
), inserted AS (
    INSERT INTO scheduling_scheduledjob
        (kind, payload, due_at, state, lease_seconds, attempts, max_attempts, last_error, key, owner_id,
         claimed_by, created_at, updated_at, priority, recurrence_id, occurrence_at)
    SELECT r.kind, r.payload, p.due, 'pending', p.lease, 0, p.attempts, '', NULL, r.owner_id, '', now(), now(),
           p.priority, r.id, p.at
    FROM plan AS p
    JOIN scheduling_recurrence AS r ON r.id = p.id
    WHERE r.state = 'active' AND r.current_at IS NOT DISTINCT FROM p.prev
      AND (r.current_at IS NULL OR p.at > r.current_at)
    ON CONFLICT (recurrence_id, occurrence_at) WHERE recurrence_id IS NOT NULL AND NOT state = 'cancelled'
        DO NOTHING
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

-- name: recurrence_state_counts
SELECT state, count(*) AS n FROM scheduling_recurrence GROUP BY state ORDER BY state;

-- name: recurrence_planner_lag
-- Active recurrences whose latest occurrence has left pending but whose next is not created yet,
-- and how long the oldest has waited since its occurrence instant.
SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(r.current_at)), 0)::float8 AS oldest_seconds
FROM scheduling_recurrence AS r
LEFT JOIN scheduling_scheduledjob AS j ON j.id = r.current_job_id
WHERE r.state = 'active' AND r.current_at <= now() AND (j.id IS NULL OR j.state <> 'pending');

-- name: upcoming_occurrences
-- Pending recurrence occurrences due in the next `horizon` seconds, per kind (the dashboard).
SELECT kind, count(*) AS n, min(due_at) AS first_due
FROM scheduling_scheduledjob
WHERE state = 'pending' AND recurrence_id IS NOT NULL AND due_at > now()
  AND due_at <= now() + make_interval(secs => %(horizon)s)
GROUP BY kind
ORDER BY kind;

-- name: count_refused_message
-- A broker message a worker refused at its door (its signature does not check: not sent by
-- defer(), beat or "run now"), counted for /metrics' timekeeper_refused_messages_total{task}.
-- Written here, not by a trigger: a refused message leaves no row to count.
INSERT INTO scheduling_outcomecounter AS c (metric, label, outcome, value)
VALUES ('refused_messages', %(task)s, '', 1)
ON CONFLICT (metric, label, outcome) DO UPDATE SET value = c.value + 1
RETURNING value;

-- name: job_owner
-- Who a job belongs to (registry.Job.owner_id): its owner, or, once that user was deleted, who
-- it was (former_owner; owner_id is then NULL, which must not read as "the system's").
SELECT owner_id, former_owner FROM scheduling_scheduledjob WHERE id = %(id)s;
