-- Sweeping, pruning and the status numbers of due_at jobs. Loaded once by scheduling.due_at.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: lock_expired_claims
-- The sweeper's first statement (the second is set_job_states, in the same transaction, with the
-- decisions of due_at.lifecycle): running jobs whose holder stopped heartbeating for longer than
-- the job's lease (or, with heartbeats off, claims older than sweep_after), and claims never
-- started within a lease whose message is no longer in the queue (lost with the broker) and was
-- not found at the previous sweep either (`confirmed`: their tokens, from unseen_unstarted_claims),
-- locked for this transaction. SKIP LOCKED and a LIMIT keep each statement short; a running atomic chunk
-- locks its rows, so its jobs are never taken here.
--
-- Crash isolation needs one more fact per running row: how many rows of its batch (same holder,
-- same claim) are still running, its unfinished jobs, the culprit among them (batch_rows). The
-- rows go batch by batch, oldest claim first.
WITH stale AS (
    SELECT id, token, kind, state, attempts, max_attempts, claimed_at, claimed_by, run_alone,
           backoff_base_seconds, backoff_cap_seconds
    FROM scheduling_scheduledjob
    WHERE state IN ('claimed', 'running') AND claimed_at IS NOT NULL  -- every claim: it names the claimed set's index
      AND CASE WHEN state = 'running'
               -- started: the holder renews heartbeat_at while it runs the job
               THEN CASE WHEN %(heartbeats)s
                         THEN coalesce(heartbeat_at, claimed_at) < now() - make_interval(secs => lease_seconds)
                         ELSE claimed_at < now() - make_interval(secs => %(sweep_after)s) END
               -- not started: its message waits in the queue (covered), or was lost with the broker:
               -- missing now and at the previous sweep (confirmed), not caught between two steps of a delivery
               ELSE %(check_unstarted)s AND claimed_at < now() - make_interval(secs => lease_seconds)
                    AND NOT id = ANY(%(covered)s::bigint[]) AND token = ANY(%(confirmed)s::uuid[]) END
    ORDER BY claimed_at, claimed_by, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), batches AS (
    SELECT o.claimed_by, o.claimed_at, count(*) AS size
    FROM scheduling_scheduledjob AS o
    WHERE o.state = 'running' AND o.claimed_at IS NOT NULL
      AND (o.claimed_by, o.claimed_at) IN (SELECT claimed_by, claimed_at FROM stale WHERE state = 'running')
    GROUP BY o.claimed_by, o.claimed_at
)
SELECT stale.id, stale.token::text AS token, stale.kind, stale.state, stale.attempts, stale.max_attempts,
       stale.run_alone, stale.backoff_base_seconds, stale.backoff_cap_seconds,
       stale.claimed_by || ' ' || stale.claimed_at::text AS batch, coalesce(batches.size, 1) AS batch_rows
FROM stale LEFT JOIN batches USING (claimed_by, claimed_at)
ORDER BY stale.claimed_at, stale.claimed_by, stale.id;

-- name: unseen_unstarted_claims
-- Claims never started within a lease whose message the sweeper did not find (not covered): their
-- tokens, which the next sweep confirms. Oldest first and capped, so two sweeps see the same ones
-- however many there are; a claim's token is new at every claim, so a job claimed again since is
-- not confirmed by its old claim's absence. Read without locks: the lock statement checks again.
SELECT token::text
FROM scheduling_scheduledjob
WHERE state = 'claimed' AND claimed_at IS NOT NULL
  AND claimed_at < now() - make_interval(secs => lease_seconds)
  AND NOT id = ANY(%(covered)s::bigint[])
ORDER BY claimed_at, id
LIMIT %(limit)s;

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
-- Due jobs of paused kinds and of rate-limited kinds wait on purpose: counted apart (paused,
-- rate_limited), not as backlog.
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
                             AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused OR rate_limit IS NOT NULL)
                           LIMIT %(exact_limit)s + 1) AS capped) AS backlog,
    (SELECT coalesce(extract(epoch FROM now() - min(due_at)), 0)::float8
       FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
         AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused OR rate_limit IS NOT NULL)) AS oldest_overdue_seconds,
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
                             AND kind IN (SELECT kind FROM scheduling_kindcontrol WHERE paused)
                           LIMIT %(exact_limit)s + 1) AS capped) AS paused,
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
                             AND kind IN (SELECT kind FROM scheduling_kindcontrol
                                          WHERE rate_limit IS NOT NULL AND NOT paused)
                           LIMIT %(exact_limit)s + 1) AS capped) AS rate_limited,
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending'
                           LIMIT %(exact_limit)s + 1) AS capped) AS pending,
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
                           WHERE state = 'pending' AND due_at > now() AND due_at <= now() + interval '24 hours'
                           LIMIT %(exact_limit)s + 1) AS capped) AS due_next_24h,
    (SELECT count(*) FROM scheduling_scheduledjob WHERE state IN ('claimed', 'running') AND claimed_at IS NOT NULL)
        AS claimed,
    -- stuck: a claim past its lease (or the stuck limit) that no live transaction holds. A running
    -- atomic chunk locks its rows, so its heartbeat cannot renew them: SKIP LOCKED (FOR KEY SHARE,
    -- the weakest lock, taken for this statement only) leaves those out. Once a stalled chunk's
    -- session is ended (bound_transaction) its rows are free, counted and swept.
    (SELECT count(*) FROM (SELECT 1 FROM scheduling_scheduledjob
       WHERE state IN ('claimed', 'running') AND claimed_at IS NOT NULL
         AND (coalesce(heartbeat_at, claimed_at) < now() - make_interval(secs => lease_seconds)
              OR claimed_at < now() - make_interval(secs => %(stuck_after)s))
       FOR KEY SHARE SKIP LOCKED) AS unheld) AS stuck,
    (SELECT count(*) FROM scheduling_scheduledjob
       WHERE state = 'dead' AND finished_at > now() - interval '24 hours') AS dead_last_24h;

-- name: estimate_backlog
-- Planner estimates (EXPLAIN, from the table statistics) for counts past backlog_status's exact limit.
SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
  AND kind NOT IN (SELECT kind FROM scheduling_kindcontrol WHERE paused OR rate_limit IS NOT NULL);

-- name: estimate_paused
SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
  AND kind IN (SELECT kind FROM scheduling_kindcontrol WHERE paused);

-- name: estimate_rate_limited
SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending' AND due_at <= now()
  AND kind IN (SELECT kind FROM scheduling_kindcontrol WHERE rate_limit IS NOT NULL AND NOT paused);

-- name: estimate_pending
SELECT 1 FROM scheduling_scheduledjob WHERE state = 'pending';

-- name: estimate_due_next_24h
SELECT 1 FROM scheduling_scheduledjob
WHERE state = 'pending' AND due_at > now() AND due_at <= now() + interval '24 hours';
