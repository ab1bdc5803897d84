-- Claiming and running due_at jobs: the claim, the start, heartbeats, outcomes, give-backs.
-- Loaded once by scheduling.due_at.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: lock_capped_kinds
-- Caps hold exactly under concurrent claimers: before its claim statement, a claim's transaction
-- locks the control row of every capped kind. A second claimer skips the rows the first holds
-- (SKIP LOCKED: a claim never waits, neither for another claim nor for an operator's transaction
-- left open on a control row, issue 34 item 6): a kind whose row it could not lock has no room in
-- its claim this turn (the kinds it holds are written to the transaction-local setting
-- timekeeper.held_kinds, which the claim statement reads). A kind it does lock was committed by
-- any earlier holder, and its claim statement then starts with a fresh snapshot (READ COMMITTED
-- takes one per statement) that counts that holder's claims. The lock must be its own statement: a
-- count in the statement that takes the lock reads the snapshot taken before the lock was granted,
-- and two overlapping claims would each see the whole room.
-- Rate-limited kinds are locked the same way: their windows (scheduling_kindrate) are read and
-- written only under their control row's lock. Without caps or rates nothing is locked and
-- claimers never touch each other.
-- %(rates)s false: the rate-limited kinds are left out of this claim (not locked, so no room): the
-- control loop claims them on their own cadence (control.RATE_STEP_SECONDS and each kind's refill
-- interval), not on every turn another kind's due time wakes it, since reading a rate-limited kind's
-- backlog and windows is most of a claim's cost (a partitioned rate reads up to store.PARTITION_SCAN_ROWS).
SELECT set_config('timekeeper.held_kinds', coalesce(string_agg(kind, ','), ''), true)
FROM (SELECT kind FROM scheduling_kindcontrol
      WHERE (max_running IS NOT NULL OR rate_limit IS NOT NULL) AND (%(rates)s OR rate_limit IS NULL)
      ORDER BY kind
      FOR UPDATE SKIP LOCKED) AS held;

-- name: claim_due_jobs
-- The claim is one statement so that choosing the rows and claiming them cannot be separated:
-- FOR UPDATE SKIP LOCKED makes concurrent claimers pass over each other's rows instead of waiting,
-- so any number of them get disjoint sets. Each claim gets a new token (fencing): only the holder of
-- the current token can complete or fail the job. heartbeat_at stays NULL: the lease starts when
-- the batch starts (start_jobs), not while it waits in the queue. Run it after lock_capped_kinds,
-- in the same transaction (store.claim_due_jobs does): that is what makes the caps exact.
--
-- Order: higher priority first, then earlier due_at (then id). PostgreSQL has no skip scan, so the
-- priorities (0-9) are walked one at a time, highest first: one branch per priority, each one range
-- scan of the (priority, due_at) partial index, from the priority's first row to now() (rows not yet
-- due are never read), so the cost follows the rows taken, not the rows pending. Append runs the
-- branches in order and the walk's LIMIT stops it once enough rows are locked.
-- Whatever the table's statistics say: a branch names its priority as priority = ANY(ARRAY[p]), an
-- equality to the index (so the scan stops at now()) that the planner does not take for a constant,
-- and orders by (priority, due_at); only the (priority, due_at) index gives that order, and the claim
-- runs with sorts off (store.INDEX_COSTS). Written priority = p ... ORDER BY due_at, the due_at index
-- gave the same order, and on a quiet table's statistics (analyzed with no pending row) every empty
-- priority read all the due rows through it, filtering on priority. (A row comparison,
-- (priority, due_at) <= (p, now()), also forces the index, but its scan does not stop at now(): it
-- reads every row of the priority not yet due.) A kind's branches (capped kinds, the walk kind by
-- kind) name their kind so, kind = ANY(ARRAY[kind]), and order by (kind, due_at), for the same reason.
-- The branch is written once: the loader repeats a "-- repeat p in 9..0 joined by UNION ALL" block
-- for each priority, highest first, with {p} replaced (core/db.py, parse_queries).
-- Strict priorities: while more rows of a higher priority are due than a claim takes, lower ones
-- wait (docs/operations.md, "Priorities"); a cap bounds a kind's share.
--
-- Kind controls (scheduling_kindcontrol): a paused kind's rows are left pending. A capped kind
-- (max_running) is not in the walk: its own branch takes at most its room (max_running minus its
-- claimed rows, queued or running) of its most urgent rows, from its range of the (kind, priority,
-- due_at) index. So a capped kind with a backlog takes its room and no more, and the walk fills the
-- claim with other kinds' rows (had its rows been in the walk, they would fill the LIMIT and be
-- dropped by the cap, leaving the claim short and every other kind waiting).
-- A rate-limited kind (rate_limit per rate_period_seconds, a sliding window) is not in the walk
-- either: its room is also at most the limit minus its starts inside the window (its
-- scheduling_kindrate row, or one row per value of the payload field rate_partition_by), and the
-- claim adds what it took to the window (counted). Read and written under the kind's control-row
-- lock, so the rate is exact with any number of claimers; a claim given back (unsent) stays
-- counted: the window errs below the limit, never above. A token bucket beside the window (same
-- row) spreads the starts of a busy kind: a kind that took nothing for two periods may take its
-- whole limit at once; after that at most max(2, limit / 20) at once, refilled at the limit per
-- period, so a backlog is not taken as one burst per period (which would repeat, a period apart:
-- the window's entries of one burst all expire together). And the claim keeps in step with the
-- handlers' starts (the start permits' window, handler_starts, same row: starts.sql): it takes at
-- most the limit minus the starts that will still be inside the window the control loop's step for
-- the rate from now (period / limit, at least %(start_lead_min)s and at most %(start_lead_max)s
-- seconds: control.RATE_STEP_SECONDS and WAIT_STEP_SECONDS; with a limit of 1 and a period of
-- 0.5 s or less that is the whole period, and the claim's own window alone paces it). A batch
-- whose handlers started late (an idle kind's whole-limit burst, run one job after another) would
-- otherwise have the next period's claims reach their workers while the window of starts is still
-- full: each would wait for its permit in a pool process, holding it from every other kind, and
-- start late in turn, period after period, for as long as the backlog lasts. Held back here, a job
-- waits for its permit at most about a step. A start that came less than a step after its claim
-- holds back nothing: in a steady backlog the claims keep their own pace, and the rate with them.
--
-- Batches: the claim takes whole batches, as many as the queue has room for (%(messages)s in all,
-- and per named queue its own room, %(queue_rooms)s: a kind's batches go to its queue, %(kind_queues)s,
-- and a queue without room, or without a live worker, takes nothing: its kinds, %(closed_kinds)s,
-- are left out of the claim like paused ones, so they never take another queue's room), in
-- order of urgency. Rows are cut into the batches the claim sends (the only place batches are cut;
-- each row returns its batch's rank, claim.batches_for groups by it): per kind, most urgent first, %(batch_sizes)s rows each (1 for a kind not listed), and
-- a run_alone row (its batch died with its process) in a batch of its own. A batch's urgency is its
-- first row's. Batches are kept while the room allows and fewer than %(limit)s rows come before
-- them: a batch_size=1 kind is claimed one row per free message, not %(limit)s rows to give back.
-- Rows locked and not kept are not updated; their locks end with the statement's transaction.
-- The result comes back sorted by urgency (UPDATE ... RETURNING has no order of its own).
WITH RECURSIVE
-- only held
clock AS (
    -- the rate windows' clock, read once, after lock_capped_kinds took the control rows: so it is
    -- later than every earlier holder's (now() is when the transaction began, which may be earlier)
    SELECT clock_timestamp() AS t
), controls AS (
    SELECT c.kind, c.paused, c.rate_limit, c.rate_period_seconds, c.rate_partition_by,
           CASE WHEN c.max_running IS NULL AND c.rate_limit IS NULL THEN NULL
                -- another transaction holds its control row (lock_capped_kinds): no room this turn
                WHEN NOT c.kind = ANY(string_to_array(coalesce(current_setting('timekeeper.held_kinds', true), ''), ',')) THEN 0
                ELSE least(
                    CASE WHEN c.max_running IS NULL THEN %(limit)s
                         ELSE greatest(0, c.max_running - (SELECT count(*) FROM scheduling_scheduledjob AS r
                                                           WHERE r.state IN ('claimed', 'running') AND r.kind = c.kind))
                    END,
                    -- an unpartitioned rate: its allowance (below, in kept, for a partitioned one)
                    CASE WHEN c.rate_limit IS NULL OR c.rate_partition_by <> '' THEN %(limit)s
                         ELSE (SELECT greatest(0, least(
                                   -- the window: the limit minus the starts inside the period (exact)
                                   c.rate_limit - s.used,
                                   -- the starts (in step with them): the limit minus the handlers' starts
                                   -- still inside the window a step from now
                                   c.rate_limit - (SELECT count(*) FROM unnest(w.handler_starts) AS h(at)
                                                   WHERE h.at > clock.t - make_interval(secs => c.rate_period_seconds
                                                       - least(greatest(%(start_lead_min)s, c.rate_period_seconds / c.rate_limit), %(start_lead_max)s))),
                                   -- the bucket (smooth): a kind idle for two periods may take its whole limit
                                   CASE WHEN w.tokens_at IS NULL
                                          OR w.tokens_at <= clock.t - make_interval(secs => 2 * c.rate_period_seconds)
                                        THEN c.rate_limit
                                        ELSE floor(least(greatest(2, ceil(c.rate_limit / 20.0)),
                                                         w.tokens + c.rate_limit * extract(epoch FROM clock.t - w.tokens_at)
                                                                                 / c.rate_period_seconds)) END))
                               FROM clock LEFT JOIN scheduling_kindrate AS w ON w.kind = c.kind AND w.partition = ''
                               CROSS JOIN LATERAL (SELECT coalesce(sum(u.n), 0) AS used
                                                   FROM unnest(w.starts_at, w.starts) AS u(at, n)
                                                   WHERE u.at > clock.t - make_interval(secs => c.rate_period_seconds)) AS s)
                    END)
           END AS room
    FROM scheduling_kindcontrol AS c
    WHERE c.paused OR c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL
), capped AS (
    -- per capped or rate-limited kind with room, the same walk down the priorities in its own
    -- range of the (kind, priority, due_at) index, stopped once its room is locked (rows not yet
    -- due are never read; each branch written so that only that index gives its order: the walk's
    -- comment above). A partitioned rate's kind reads up to %(partition_scan)s rows: its
    -- room is decided per partition below, and a full partition must not hide the others' rows.
    SELECT r.* FROM controls AS c
    CROSS JOIN LATERAL (
        -- repeat p in 9..0 joined by UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone,
                              CASE WHEN c.rate_partition_by = '' THEN ''
                                   ELSE left(coalesce(payload ->> c.rate_partition_by, ''), 200) END AS part
                       FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = ANY(ARRAY[c.kind]) AND priority = {p} AND due_at <= now()
                       ORDER BY kind, due_at
                       LIMIT CASE WHEN c.rate_partition_by <> '' THEN %(partition_scan)s ELSE least(c.room, %(limit)s) END
                       FOR UPDATE SKIP LOCKED) AS k{p}
        -- end repeat
        LIMIT CASE WHEN c.rate_partition_by <> '' THEN %(partition_scan)s ELSE least(c.room, %(limit)s) END
    ) AS r
    WHERE NOT c.paused AND c.room > 0 AND c.kind <> ALL(%(closed_kinds)s::text[])
), allowances AS MATERIALIZED (
    -- a partitioned rate: each partition in this claim may take the limit minus its starts inside
    -- the window (and at most its bucket): read once per partition, not once per row (MATERIALIZED:
    -- inlined, the planner moved the read into parted's filter, twice per row)
    SELECT p.kind, p.part, (SELECT greatest(0, least(
                                c.rate_limit - s.used,
                                -- the starts, as above: those still inside the window a step from now
                                c.rate_limit - (SELECT count(*) FROM unnest(w.handler_starts) AS h(at)
                                                WHERE h.at > clock.t - make_interval(secs => c.rate_period_seconds
                                                       - least(greatest(%(start_lead_min)s, c.rate_period_seconds / c.rate_limit), %(start_lead_max)s))),
                                CASE WHEN w.tokens_at IS NULL
                                       OR w.tokens_at <= clock.t - make_interval(secs => 2 * c.rate_period_seconds)
                                     THEN c.rate_limit
                                     ELSE floor(least(greatest(2, ceil(c.rate_limit / 20.0)),
                                                      w.tokens + c.rate_limit * extract(epoch FROM clock.t - w.tokens_at)
                                                                              / c.rate_period_seconds)) END))
                            FROM clock LEFT JOIN scheduling_kindrate AS w ON w.kind = p.kind AND w.partition = p.part
                            CROSS JOIN LATERAL (SELECT coalesce(sum(u.n), 0) AS used
                                                FROM unnest(w.starts_at, w.starts) AS u(at, n)
                                                WHERE u.at > clock.t - make_interval(secs => c.rate_period_seconds)) AS s)
                           AS allowance
    FROM (SELECT DISTINCT kind, part FROM capped) AS p JOIN controls AS c USING (kind)
    WHERE c.rate_limit IS NOT NULL AND c.rate_partition_by <> ''
), parted AS (
    -- a partition whose window is full takes nothing: its rows are dropped before they are sorted
    -- (most partitions of a busy kind, most turns: 1,000 rows sorted by partition cost 3 ms a claim)
    SELECT capped.*, a.allowance,
           row_number() OVER (PARTITION BY kind, part ORDER BY priority DESC, due_at, id) AS in_part
    FROM capped LEFT JOIN allowances AS a USING (kind, part)
    WHERE a.allowance IS NULL OR a.allowance > 0  -- no allowance: not a partitioned rate
), kept AS (
    -- each partition takes at most its allowance; then the kind takes at most its room (its cap's)
    -- of what is left. Rows locked and not kept are not updated (their locks end with the transaction).
    SELECT id, kind, priority, due_at, run_alone, part FROM (
        SELECT p.*, row_number() OVER (PARTITION BY p.kind ORDER BY p.priority DESC, p.due_at, p.id) AS in_kind, c.room
        FROM parted AS p JOIN controls AS c USING (kind)
        WHERE p.allowance IS NULL OR p.in_part <= p.allowance
    ) AS ranked_in_kind
    WHERE in_kind <= room
),
-- else
controls AS (
    -- no control row is held (lock_capped_kinds held none): no capped or rate-limited kind has room
    -- in this claim, and the walk only needs to know which kinds to leave out
    SELECT c.kind FROM scheduling_kindcontrol AS c WHERE c.paused OR c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL
),
-- end only
head AS MATERIALIZED (
    -- Which walk. The walk by due time (priority by priority, the (priority, due_at) index) reads, and
    -- passes over, every due row of a kind it leaves out (paused, capped, rate-limited, of a closed
    -- queue) that comes before the rows it takes: a rate-limited kind's backlog is such rows, at the
    -- head of its priority, on every claim
    -- (bench flow: 8,000 due rows of a 5/s-per-partition kind cost every claim 3-4 ms). When most of
    -- the first %(walk_head)s due rows are of such kinds, the walk goes kind by kind instead. Nothing is
    -- read here when no kind is left out.
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM controls) AND cardinality(%(closed_kinds)s::text[]) = 0 THEN false
                ELSE (SELECT count(*) FILTER (WHERE h.kind IN (SELECT kind FROM controls)
                                                 OR h.kind = ANY(%(closed_kinds)s::text[])) * 2 > count(*)
                      FROM (SELECT kind FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
                            ORDER BY due_at LIMIT %(walk_head)s) AS h)
           END AS by_kind
), pending_kinds AS (
    -- every kind with a pending row, one descent of the (kind, priority, due_at) index each (a loose
    -- scan), for the walk kind by kind: a kind this process has not registered is walked too
    (SELECT kind FROM scheduling_scheduledjob WHERE state = 'pending' ORDER BY kind LIMIT 1)
    UNION ALL
    SELECT (SELECT j.kind FROM scheduling_scheduledjob AS j WHERE j.state = 'pending' AND j.kind > k.kind
            ORDER BY j.kind LIMIT 1)
    FROM pending_kinds AS k
    WHERE k.kind IS NOT NULL
), kind_candidates AS MATERIALIZED (  -- read only when the walk goes kind by kind (below)
    SELECT r.id FROM pending_kinds AS k
    CROSS JOIN LATERAL (
        -- repeat p in 9..0 joined by UNION ALL
        SELECT * FROM (SELECT id, priority, due_at FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND kind = ANY(ARRAY[k.kind]) AND priority = {p} AND due_at <= now()
                       ORDER BY kind, due_at LIMIT %(limit)s) AS w{p}
        -- end repeat
        LIMIT %(limit)s
    ) AS r
    WHERE k.kind IS NOT NULL AND k.kind NOT IN (SELECT kind FROM controls) AND k.kind <> ALL(%(closed_kinds)s::text[])
    ORDER BY r.priority DESC, r.due_at, r.id
    LIMIT %(limit)s
), walk AS (
    SELECT * FROM (
        SELECT * FROM (
        -- repeat p in 9..0 joined by UNION ALL
        SELECT * FROM (SELECT id, kind, priority, due_at, run_alone, '' AS part FROM scheduling_scheduledjob
                       WHERE state = 'pending' AND priority = ANY(ARRAY[{p}]) AND due_at <= now()
                         AND kind NOT IN (SELECT kind FROM controls) AND kind <> ALL(%(closed_kinds)s::text[])
                       ORDER BY priority, due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p{p}
        -- end repeat
        ) AS by_priority
        WHERE NOT (SELECT by_kind FROM head)
        LIMIT %(limit)s
    ) AS by_due
    UNION ALL
    -- kind by kind: each kind's most urgent due rows, read in its range of the (kind, priority,
    -- due_at) index one priority at a time (as a capped kind's: a row not yet due is never read),
    -- then the most urgent %(limit)s of all, as the walk above takes them; only those are locked
    -- (read unlocked, locked after: every kind's reads are %(limit)s rows at most, not every kind's
    -- locks). A row another claim took meanwhile fails the lock's re-check (state = 'pending').
    SELECT * FROM (
        SELECT j.id, j.kind, j.priority, j.due_at, j.run_alone, '' AS part FROM scheduling_scheduledjob AS j
        WHERE (SELECT by_kind FROM head) AND j.id = ANY(ARRAY(SELECT id FROM kind_candidates))
          -- re-checked on the row as it is when locked; a CASE, so that no index serves it and the rows
          -- are read by primary key (as a condition, due_at <= now() led the planner to read every due
          -- row of the (kind, priority, due_at) index)
          AND CASE WHEN j.state = 'pending' THEN j.due_at <= now() ELSE false END
        FOR UPDATE OF j SKIP LOCKED
    ) AS by_kind
), due AS (
    -- only held
    SELECT * FROM kept
    UNION ALL
    -- end only
    SELECT * FROM walk
), sized AS (
    SELECT due.*, coalesce(b.size, 1) AS size, coalesce(b.queue, 'default') AS queue,
           CASE WHEN due.run_alone THEN due.id
                ELSE (row_number() OVER (PARTITION BY due.kind, due.run_alone
                                         ORDER BY due.priority DESC, due.due_at, due.id) - 1) / coalesce(b.size, 1)
           END AS batch_no
    FROM due LEFT JOIN unnest(%(kinds)s::text[], %(batch_sizes)s::int[], %(kind_queues)s::text[]) AS b(kind, size, queue)
                       ON b.kind = due.kind
), headed AS (
    SELECT sized.id, sized.queue,
           first_value(priority) OVER batch AS head_priority,
           first_value(due_at) OVER batch AS head_due_at,
           first_value(id) OVER batch AS head_id,
           count(*) OVER (PARTITION BY kind, run_alone, batch_no) AS batch_rows
    FROM sized
    WINDOW batch AS (PARTITION BY kind, run_alone, batch_no ORDER BY priority DESC, due_at, id)
), ranked AS (
    SELECT headed.id,
           dense_rank() OVER urgency AS batch_rank,
           dense_rank() OVER (PARTITION BY queue ORDER BY head_priority DESC, head_due_at, head_id) AS queue_rank,
           queue,
           count(*) OVER urgency - batch_rows AS rows_before  -- the peers of a row are its batch's rows
    FROM headed
    WINDOW urgency AS (ORDER BY head_priority DESC, head_due_at, head_id)
), allowed AS (
    -- each queue's batches up to its own room (%(queue_rooms)s: back-pressure per queue)
    SELECT id FROM ranked
    LEFT JOIN unnest(%(queues)s::text[], %(queue_rooms)s::int[]) AS q(name, room) ON q.name = ranked.queue
    WHERE rows_before < %(limit)s
      AND CASE WHEN q.room IS NULL THEN batch_rank <= %(messages)s ELSE queue_rank <= q.room END
), claimed AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = 'claimed', token = gen_random_uuid(), claimed_at = now(), heartbeat_at = NULL,
        claimed_by = '', attempts = j.attempts + 1, updated_at = now()
    -- by primary key, row by row: a join would let a high estimate of the capped rows choose a
    -- hash join over the whole table (the ids are few: at most a claim's rows)
    WHERE j.id = ANY(ARRAY(SELECT id FROM allowed))
    RETURNING j.id, j.token::text AS token, j.kind, j.priority, j.due_at, j.run_alone, j.timeout_seconds
-- only held
), counted AS (
    -- the rate windows: each rate-limited kind's (and partition's) claimed rows at the clock, the
    -- entries older than its period dropped, and its bucket refilled then spent. Written only under
    -- the kind's control-row lock, so the row read here (old) is the one replaced.
    INSERT INTO scheduling_kindrate AS w (kind, partition, starts_at, starts, tokens, tokens_at)
    SELECT t.kind, t.part,
           ARRAY(SELECT u.at FROM unnest(old.starts_at, old.starts) AS u(at, n)
                 WHERE u.at > clock.t - make_interval(secs => c.rate_period_seconds) ORDER BY u.at) || clock.t,
           ARRAY(SELECT u.n FROM unnest(old.starts_at, old.starts) AS u(at, n)
                 WHERE u.at > clock.t - make_interval(secs => c.rate_period_seconds) ORDER BY u.at) || t.n,
           greatest(0, CASE WHEN old.tokens_at IS NULL
                              OR old.tokens_at <= clock.t - make_interval(secs => 2 * c.rate_period_seconds)
                            THEN least(greatest(2, ceil(c.rate_limit / 20.0)), c.rate_limit - t.n)
                            ELSE least(greatest(2, ceil(c.rate_limit / 20.0)),
                                       old.tokens + c.rate_limit * extract(epoch FROM clock.t - old.tokens_at)
                                                    / c.rate_period_seconds) - t.n END),
           clock.t
    FROM (SELECT d.kind, d.part, count(*)::int AS n FROM claimed JOIN kept AS d USING (id) GROUP BY d.kind, d.part) AS t
    JOIN controls AS c ON c.kind = t.kind AND c.rate_limit IS NOT NULL
    CROSS JOIN clock
    LEFT JOIN scheduling_kindrate AS old ON old.kind = t.kind AND old.partition = t.part
    ON CONFLICT (kind, partition) DO UPDATE
    SET starts_at = EXCLUDED.starts_at, starts = EXCLUDED.starts, tokens = EXCLUDED.tokens, tokens_at = EXCLUDED.tokens_at
-- end only
)
-- Each row says which batch it is in (its rank, most urgent batch first): the claim sends exactly
-- these batches (claim.batches_for groups by it), so batches are cut here and nowhere else.
SELECT c.id, c.token, c.kind, c.priority, c.due_at, c.run_alone, c.timeout_seconds, r.batch_rank AS batch
FROM claimed AS c JOIN ranked AS r USING (id)
ORDER BY c.priority DESC, c.due_at, c.id;

-- name: next_due_times
-- Distinct due instants coming up soon, for early wake-ups (the row stays the truth).
SELECT DISTINCT date_trunc('milliseconds', due_at) AS at,
       extract(epoch FROM date_trunc('milliseconds', due_at) - now())::float8 AS in_seconds
FROM scheduling_scheduledjob
WHERE state = 'pending' AND due_at > now() AND due_at <= now() + make_interval(secs => %(horizon)s)
ORDER BY at
LIMIT %(limit)s;

-- name: start_jobs
-- A claim runs at most once: only rows still claimed under the presented token (not yet started)
-- become running and are handed to the handler. A redelivered message finds them started and leaves them
-- to the sweeper, which records the attempt and counts it against max_attempts. The jobs come
-- back in the message's order (the claim's: most urgent first), which is the order they run in.
WITH started AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = 'running', claimed_by = %(worker)s, heartbeat_at = now()
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) WITH ORDINALITY AS t(id, token, n)
    WHERE j.id = t.id AND j.token = t.token AND j.state = 'claimed'
    RETURNING j.id, j.token::text AS token, j.kind, j.payload, j.attempts, j.max_attempts, j.due_at, t.n,
              j.timeout_seconds, j.backoff_base_seconds, j.backoff_cap_seconds, j.atomic
)
-- (kind as text: the statement is prepared on the worker's connection, and a prepared statement whose
-- result type a migration changed, even a varchar's length, fails where a text result does not)
SELECT s.id, s.token, s.kind::text AS kind, s.payload, s.attempts, s.max_attempts, s.due_at, clock_timestamp() AS db_now,
       s.timeout_seconds, s.backoff_base_seconds, s.backoff_cap_seconds, s.atomic,
       -- a rate-limited kind's job takes a start permit before its handler runs (starts.sql): the
       -- window it counts in, as the claim computes it; NULL for a kind without a rate
       CASE WHEN c.rate_limit IS NULL THEN NULL
            WHEN c.rate_partition_by = '' THEN ''
            ELSE left(coalesce(s.payload ->> c.rate_partition_by, ''), 200) END AS rate_partition
FROM started AS s LEFT JOIN scheduling_kindcontrol AS c ON c.kind = s.kind
ORDER BY s.n;

-- name: heartbeat_jobs
-- Renew the lease of the started claims a worker process holds; returns every one still held
-- under its token (a claim not started yet has no lease to renew). Rows locked by the process's own open batch transaction (atomic kinds) are skipped, not
-- waited for: the sweeper cannot take a locked row either, and the batch's commit ends the claim.
-- Each comes with the abort asked for that claim, if any (api.abort, abort.sql): the worker learns
-- of it here, with no round trip of its own.
WITH mine AS (
    SELECT j.id, j.token
    FROM scheduling_scheduledjob AS j
    JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token) ON j.id = t.id AND j.token = t.token
    WHERE j.state = 'running'
), free AS (
    SELECT id FROM scheduling_scheduledjob
    WHERE id IN (SELECT id FROM mine) AND state = 'running'
    FOR UPDATE SKIP LOCKED
), renewed AS (
    UPDATE scheduling_scheduledjob AS j
    SET heartbeat_at = clock_timestamp()  -- inside a chunk now() is the chunk's start: already old
    FROM free
    WHERE j.id = free.id
    RETURNING j.id
)
SELECT mine.id, a.requested_by AS abort_by, a.requested_at AS abort_at
FROM mine LEFT JOIN scheduling_jobabort AS a ON a.job_id = mine.id AND a.token = mine.token;

-- name: lock_claims
-- An atomic batch's transaction locks its claims first: only rows still claimed under the token
-- come back, and until the transaction ends no sweeper (SKIP LOCKED) can take them, so the
-- handlers' writes and the outcomes commit together or not at all.
SELECT j.id
FROM scheduling_scheduledjob AS j
JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token) ON j.id = t.id AND j.token = t.token
WHERE j.state = 'running'
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

-- name: set_job_states
-- Every way out of claimed and running, in one statement (the model: River's
-- JobSetStateIfRunningMany): the runner's outcomes, a claim given back unsent, a worker's shutdown,
-- a lost chunk and the sweeper. Each row comes with its claim token, the state the caller believes
-- it is in, and the name of its event's plan; only a row still in such a state under that token
-- changes (a stale token changes nothing and is not returned). Nothing is decided here: the plan
-- (%(plans)s, built by due_at.lifecycle.plan) holds the decision for each combination of the facts
-- a row may have changed while its holder decided: attempts spent (api.retire_owner makes the
-- current attempt the last), owner deleted (former_owner), run_alone. The row is locked and read
-- first (FOR UPDATE re-reads a row changed meanwhile), so the decision follows what the row says now.
-- A retry is due after %(delays)s seconds from this statement (clock_timestamp(): inside an atomic
-- chunk now() is when the chunk began). The attempt is recorded when the decision says so.
-- An occurrence retired by its recurrence's pause or cancel (retired, on the row: read under its
-- lock, where the recurrence's state would be read in this statement's older snapshot) takes the
-- deleted owner's decisions (owner_deleted): given back it is cancelled, not pending again.
-- A keyed row that started (running: out of scheduledjob_waiting_owner_key_uniq, so a successor may
-- wait on its key) takes its decision from the plan's second half (lifecycle.plans: given back, it
-- is refunded rather than uncounted). Read off the row alone: a successor's insert not committed
-- yet is invisible to a check of other rows, and its commit then failed this statement.
WITH plans AS MATERIALIZED (  -- parsed once: a parameter's cast in the row expression is evaluated per row
    SELECT %(plans)s::jsonb AS by_event
), input AS (
    SELECT t.*
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(from_states)s::text[], %(events)s::text[],
                %(delays)s::float8[], %(errors)s::text[], %(started)s::timestamptz[], %(finished)s::timestamptz[],
                %(tracebacks)s::text[])
         AS t(id, token, from_states, event, delay, error, started_at, finished_at, traceback)
), judged AS (
    SELECT input.*, j.due_at AS old_due_at, j.attempts, j.claimed_at, j.claimed_by,
           plans.by_event -> input.event
               -> ((j.key IS NOT NULL AND j.state = 'running')::int * 8
                   + (j.attempts >= j.max_attempts)::int * 4
                   + (j.former_owner <> '' OR j.retired)::int * 2
                   + j.run_alone::int) AS d
    FROM input
    CROSS JOIN plans
    JOIN scheduling_scheduledjob AS j
      ON j.id = input.id AND j.token = input.token AND j.state = ANY(string_to_array(input.from_states, ','))
    FOR UPDATE OF j
), moved AS (
    UPDATE scheduling_scheduledjob AS j
    SET state = judged.d ->> 'state',
        due_at = CASE WHEN (judged.d ->> 'backoff')::boolean
                      THEN clock_timestamp() + make_interval(secs => judged.delay) ELSE j.due_at END,
        finished_at = CASE WHEN (judged.d ->> 'finished')::boolean THEN clock_timestamp() END,
        attempts = j.attempts - CASE WHEN (judged.d ->> 'uncount')::boolean THEN 1 ELSE 0 END,
        max_attempts = j.max_attempts + CASE WHEN (judged.d ->> 'refund')::boolean THEN 1 ELSE 0 END,
        run_alone = j.run_alone OR (judged.d ->> 'run_alone')::boolean,
        token = CASE WHEN (judged.d ->> 'keep_claim')::boolean THEN j.token END,
        claimed_at = CASE WHEN (judged.d ->> 'keep_claim')::boolean THEN j.claimed_at END,
        claimed_by = CASE WHEN (judged.d ->> 'keep_claim')::boolean THEN j.claimed_by ELSE '' END,
        heartbeat_at = NULL, last_error = judged.error, updated_at = now()
    FROM judged
    WHERE j.id = judged.id
    RETURNING j.id, j.state, j.due_at, (judged.d ->> 'refund')::boolean AS refunded
), logged AS (
    INSERT INTO scheduling_jobattempt (job_id, number, token, worker, due_at, started_at, finished_at, outcome, error,
                                       traceback)
    SELECT judged.id, judged.attempts, judged.token, judged.claimed_by, judged.old_due_at,
           coalesce(judged.started_at, judged.claimed_at), coalesce(judged.finished_at, clock_timestamp()),
           judged.d ->> 'record', judged.error, judged.traceback
    FROM judged JOIN moved USING (id)
    WHERE judged.d ->> 'record' IS NOT NULL
)
SELECT id, state::text AS state, due_at, refunded FROM moved;  -- text: as start_jobs's kind

-- name: committed_jobs
-- After an ambiguous COMMIT (the connection dropped while committing): the jobs of the chunk that
-- the server did commit: their outcome (succeeded or failed) is recorded under the chunk's claim
-- tokens, which no other holder can write.
SELECT a.job_id, a.outcome = 'succeeded' AS succeeded
FROM scheduling_jobattempt AS a
JOIN unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token) ON a.job_id = t.id AND a.token = t.token
WHERE a.outcome <> 'reclaimed';
