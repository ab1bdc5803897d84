-- Start permits of rate-limited kinds (due_at/starts.py): the claim decides how many jobs of a
-- rate-limited kind leave pending (claim.sql, "rate windows"); a worker asks here before each such
-- job's handler runs, so the handlers' starts keep the limit too. Loaded once by
-- scheduling.due_at.store; run on the worker process's own autocommit connection, never inside a
-- batch's transaction (one statement, its row lock held for that statement only).

-- name: take_start
-- A permit for one start of kind %(kind)s, partition %(partition)s: granted when the window holds
-- fewer than the kind's rate_limit starts after t - rate_period_seconds, where t is the clock read
-- after the row's lock was taken (so permits are granted in the order they are written). Every
-- start after t - period counts, not only those before t: that makes the limit exact for any
-- half-open span of the period whatever order concurrent permits commit in. A granted start is
-- added at t; t is the handler's recorded start. Refused: wait_seconds is when the oldest start
-- that must leave the window leaves it. A kind whose rate was removed is granted and its window
-- emptied. No row (the claim writes it when it takes the kind's jobs): nothing is returned and
-- the caller writes the row (add_start_window) and asks again.
WITH locked AS MATERIALIZED (
    SELECT w.id, w.handler_starts, c.rate_limit, c.rate_period_seconds
    FROM scheduling_kindrate AS w
    LEFT JOIN scheduling_kindcontrol AS c ON c.kind = w.kind
    WHERE w.kind = %(kind)s AND w.partition = %(partition)s
    FOR UPDATE OF w
), clock AS MATERIALIZED (
    SELECT l.id, l.handler_starts, l.rate_limit, l.rate_period_seconds, clock_timestamp() AS t FROM locked AS l
), judged AS MATERIALIZED (
    SELECT k.id, k.t, k.rate_limit, k.rate_period_seconds,
           ARRAY(SELECT u.at FROM unnest(k.handler_starts) AS u(at)
                 WHERE k.rate_limit IS NOT NULL AND u.at > k.t - make_interval(secs => k.rate_period_seconds)
                 ORDER BY u.at) AS kept
    FROM clock AS k
), written AS (
    UPDATE scheduling_kindrate AS w
    SET handler_starts = CASE WHEN j.rate_limit IS NOT NULL AND cardinality(j.kept) < j.rate_limit
                              THEN j.kept || j.t ELSE j.kept END
    FROM judged AS j
    WHERE w.id = j.id
    RETURNING w.id
)
SELECT j.t AS at,
       j.rate_limit IS NULL OR cardinality(j.kept) < j.rate_limit AS granted,
       CASE WHEN j.rate_limit IS NULL OR cardinality(j.kept) < j.rate_limit THEN 0.0
            ELSE extract(epoch FROM j.kept[cardinality(j.kept) - j.rate_limit + 1]
                                    + make_interval(secs => j.rate_period_seconds) - j.t)::float8 END AS wait_seconds
FROM judged AS j JOIN written AS w ON w.id = j.id;

-- name: add_start_window
-- The window row of %(kind)s, partition %(partition)s, when the claim has not written it yet (a job
-- claimed before its kind had a rate).
INSERT INTO scheduling_kindrate (kind, partition) VALUES (%(kind)s, %(partition)s)
ON CONFLICT (kind, partition) DO NOTHING;
