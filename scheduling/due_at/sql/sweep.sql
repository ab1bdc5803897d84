-- Sweeping, pruning and the status numbers of due_at jobs. Loaded once by scheduling.due_at.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

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
-- A job whose owner was deleted (former_owner set, api.retire_owner) that would go back to pending
-- is cancelled instead: pending again it would run as nobody's job and count in the system's backlog.
WITH stale AS (
    SELECT id, token, kind, attempts, max_attempts, due_at, claimed_at, claimed_by, run_alone,
           backoff_base_seconds, backoff_cap_seconds, former_owner <> '' AS retired
    FROM scheduling_scheduledjob
    WHERE state = 'claimed' AND claimed_at IS NOT NULL  -- every claim: it names the claimed set's index
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
    WHERE o.state = 'claimed' AND o.claimed_at IS NOT NULL AND o.claimed_by <> ''
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
    SET state = CASE WHEN judged.retried AND judged.retired THEN 'cancelled'
                     WHEN judged.retried THEN 'pending' ELSE 'dead' END,
        finished_at = CASE WHEN NOT judged.retried OR judged.retired THEN now() END,
        max_attempts = j.max_attempts + CASE WHEN judged.shared THEN 1 ELSE 0 END,
        run_alone = j.run_alone OR judged.started,
        due_at = CASE WHEN judged.started AND judged.retried AND NOT judged.retired
                      THEN now() + make_interval(secs => judged.delay) ELSE j.due_at END,
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
SELECT id, state, due_at, shared AS refunded, coalesce(batch, '') AS batch FROM moved;

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
    (SELECT count(*) FROM scheduling_scheduledjob WHERE state = 'claimed' AND claimed_at IS NOT NULL) AS claimed,
    -- stuck: a claim past its lease (or the stuck limit) that no live transaction holds. A running
    -- atomic chunk locks its rows, so its heartbeat cannot renew them: SKIP LOCKED (FOR KEY SHARE,
    -- the weakest lock, taken for this statement only) leaves those out. Once a stalled chunk's
    -- session is ended (bound_transaction) its rows are free, counted and swept.
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
       WHERE state = 'claimed' AND claimed_at IS NOT NULL
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
