-- Claiming and running due_at jobs: the claim, the start, heartbeats, outcomes, give-backs.
-- Loaded once by scheduling.due_at.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

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
-- A job whose owner was deleted (former_owner set, api.retire_owner) is cancelled instead: pending
-- again it would run as nobody's job and count in the system's backlog (owner_id IS NULL).
UPDATE scheduling_scheduledjob AS j
SET state = CASE WHEN j.former_owner <> '' THEN 'cancelled' ELSE 'pending' END,
    finished_at = CASE WHEN j.former_owner <> '' THEN now() END,
    token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
    attempts = j.attempts - 1, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token)
WHERE j.id = t.id AND j.token = t.token AND j.state = 'claimed' AND j.claimed_by = ''
RETURNING j.id;

-- name: give_back_unknown_kind
-- A worker that does not know a started job's kind (a worker of the old release in a rolling deploy,
-- handed a kind only the new release has) gives the claim back uncharged: pending again after
-- %(delay)s seconds (so a job only old workers see does not loop hot), the attempt the claim counted
-- given back, no attempt recorded, the reason kept in last_error. A job whose owner was deleted
-- (former_owner set) is cancelled instead, as unclaim_jobs does.
UPDATE scheduling_scheduledjob AS j
SET state = CASE WHEN j.former_owner <> '' THEN 'cancelled' ELSE 'pending' END,
    finished_at = CASE WHEN j.former_owner <> '' THEN clock_timestamp() END,
    due_at = CASE WHEN j.former_owner <> '' THEN j.due_at
                  ELSE clock_timestamp() + make_interval(secs => %(delay)s) END,
    token = NULL, claimed_at = NULL, heartbeat_at = NULL, claimed_by = '',
    attempts = j.attempts - 1, last_error = %(reason)s, updated_at = clock_timestamp()
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
-- A job whose owner was deleted (former_owner set, api.retire_owner) that would go back to pending is
-- cancelled instead: pending again it would run as nobody's job and count in the system's backlog.
WITH input AS (
    SELECT t.id, t.token, t.delay, j.due_at, j.attempts, j.max_attempts, j.claimed_at, j.claimed_by,
           %(shared)s AND NOT j.run_alone AS shared,
           (%(shared)s AND NOT j.run_alone OR j.attempts < j.max_attempts) AS retried,
           j.former_owner <> '' AS retired
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(delays)s::float8[]) AS t(id, token, delay)
    JOIN scheduling_scheduledjob AS j ON j.id = t.id
), released AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = CASE WHEN input.retried AND input.retired THEN 'cancelled'
                     WHEN input.retried THEN 'pending' ELSE 'dead' END,
        finished_at = CASE WHEN NOT input.retried OR input.retired THEN clock_timestamp() END,
        max_attempts = j.max_attempts + CASE WHEN input.shared THEN 1 ELSE 0 END,
        run_alone = true,
        due_at = CASE WHEN input.retried AND NOT input.retired
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
SELECT id, state, due_at, shared AS refunded FROM released;

-- name: committed_jobs
-- After an ambiguous COMMIT (the connection dropped while committing): the jobs of the chunk that
-- the server did commit: their outcome (succeeded or failed) is recorded under the chunk's claim
-- tokens, which no other holder can write.
SELECT a.job_id, a.outcome = 'succeeded' AS succeeded
FROM scheduling_jobattempt AS a
JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token) ON a.job_id = t.id AND a.token = t.token
WHERE a.outcome <> 'reclaimed';
