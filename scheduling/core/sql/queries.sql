-- The core's statements, by name: the clocks, leaders' heartbeats, advisory-lock checks, a job's
-- owner and key for the registry, and the JSON API's creation limits. Loaded once by scheduling.core.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: database_now
-- The database clock: the only clock that says what is due (beat measures its offset to it).
SELECT now() AS now;

-- name: database_clock
-- The database clock at this instant (clock_timestamp()), not at the transaction's start (now()):
-- a delay given inside a long transaction counts from the call.
SELECT clock_timestamp() AS now;

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

-- name: job_owner
-- Who a job belongs to (registry.Job.owner_id): its owner, or, once that user was deleted, who
-- it was (former_owner; owner_id is then NULL, which must not read as "the system's").
SELECT owner_id, former_owner FROM scheduling_scheduledjob WHERE id = %(id)s;

-- name: count_refused_message
-- A broker message a worker refused at its door (its signature does not check: not sent by
-- defer(), beat or "run now"), counted for /metrics' timekeeper_refused_messages_total{task}.
-- Written here, not by a trigger: a refused message leaves no row to count.
INSERT INTO scheduling_outcomecounter AS c (metric, label, outcome, value)
VALUES ('refused_messages', %(task)s, '', 1)
ON CONFLICT (metric, label, outcome) DO UPDATE SET value = c.value + 1
RETURNING value;

-- name: job_key
SELECT key FROM scheduling_scheduledjob WHERE id = %(id)s;

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

-- name: give_back_create_allowance
-- Returns one creation to an owner's bucket (a request charged before it knew it would create
-- nothing: a resume of a recurrence already active): full_at moves one emission interval back,
-- never before now() (a bucket is never more than whole).
UPDATE scheduling_apiratebucket
SET full_at = greatest(full_at - make_interval(secs => %(emission)s), now())
WHERE owner_id = %(owner_id)s;

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

-- name: bound_session
-- A session that holds a lock, a leadership or a leader's transactions asks PostgreSQL to notice a
-- client that vanished without a word (a lost host, a cut network: no FIN, no RST) within a bound,
-- instead of the OS keepalive time (2 h by default): keepalive probes after idle_s of silence,
-- every interval_s, count of them unanswered; tcp_user_timeout ends it when data it sent stays
-- unacknowledged that long (keepalives are not sent then); and a transaction left open that long
-- ends with its locks. All are per-session settings (libpq's keepalives_* only make the client
-- notice). lock_timeout: a lock wait gives up this soon (a leader's statement must not wait for
-- a vanished session's locks longer than its lead survives without a word; 0 = no limit).
-- On a Unix socket the tcp_* settings are accepted and read 0: no network can vanish there.
SELECT set_config('tcp_keepalives_idle', %(idle_s)s, false),
       set_config('tcp_keepalives_interval', %(interval_s)s, false),
       set_config('tcp_keepalives_count', %(count)s, false),
       set_config('tcp_user_timeout', %(user_timeout_ms)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_in_transaction_ms)s, false),
       set_config('lock_timeout', %(lock_timeout_ms)s, false);

-- name: bound_running_statement
-- PostgreSQL 14+: a running statement polls its client's socket this often, so one that waits on a
-- lock (or runs long) for a vanished client ends once the keepalives above have failed.
SELECT set_config('client_connection_check_interval', %(check_ms)s, false);
