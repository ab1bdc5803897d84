-- Fixed-time schedules: the run ledger (the exactly-once gate), history limits, beat's progress.
-- Loaded once by scheduling.fixed.store.
-- Times come from the database clock (now(), clock_timestamp()) only.
-- Every state change is conditional on the state (and claim token) the caller believes in.

-- name: insert_schedule_run
-- The exactly-once gate. The unique (schedule, tick) constraint admits the first delivery of a
-- tick; any later one (a second beat, a redelivered message, a re-sent tick) lands in ON CONFLICT,
-- which counts it on the existing row and returns inserted = false (xmax is 0 only for a row this
-- statement inserted). A tick at or before the schedule's pruned_through watermark had its row
-- pruned: no row comes back and the caller refuses it too. Not a "run now" tick (the wall clock when
-- asked): beat's watermark may already be past it while it waits in the queue; its own row, kept for
-- the broker's visibility timeout (prune_schedule_runs), refuses its copies. Lateness is measured on
-- the database clock.
WITH policy AS (
    SELECT id, pruned_through FROM scheduling_schedulepolicy WHERE id = %(schedule_id)s
)
INSERT INTO scheduling_schedulerun AS r
    (schedule_id, tick, state, trigger, attempt, worker, task_id, started_at, error, duplicates_refused, holds_lock,
     deadline_seconds)
SELECT policy.id, coalesce(%(tick)s, now()), 'running', %(trigger)s, 1, %(worker)s, %(task_id)s, now(), '', 0,
       %(holds_lock)s, %(deadline_seconds)s
FROM policy
WHERE %(trigger)s = 'manual' OR policy.pruned_through IS NULL OR coalesce(%(tick)s, now()) > policy.pruned_through
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
-- Other runs of the schedule still marked running (replace stops them by their Celery task id), and
-- whether each took the overlap lock (false: admitted under allow before an edit; empty: an older
-- release's row).
SELECT id, task_id, worker, tick, holds_lock
FROM scheduling_schedulerun
WHERE schedule_id = %(schedule_id)s AND state = 'running' AND id <> %(id)s
ORDER BY tick;

-- name: close_other_running_runs
-- Called by a run that holds the schedule's advisory lock: any other run still marked running that
-- was admitted holding it cannot be running (it would hold the lock), so its process died or was
-- stopped. Replace marks them 'replaced'; forbid marks them 'failed' with the reason. A run admitted
-- under allow (before an edit to forbid or replace) holds no lock: it may be running, and is left
-- to its outcome or to the orphan duty's deadline; but replace, which has revoked its task, marks
-- it too (unlocked_too). A run admitted by a release before this one (holds_lock empty) is closed
-- as before.
UPDATE scheduling_schedulerun
SET state = %(state)s, error = %(error)s, finished_at = now()
WHERE schedule_id = %(schedule_id)s AND state = 'running' AND id <> %(id)s
  AND (holds_lock IS DISTINCT FROM false OR %(unlocked_too)s::boolean)
RETURNING id;

-- name: running_runs_to_check
-- Every run still marked running, with what the orphan duty needs to judge it (fixed/orphans.py):
-- its schedule's policy, kind and deadline, and its age by the database clock. Few rows (the
-- partial index schedulerun_running_idx holds only running runs).
SELECT r.id, r.schedule_id, p.concurrency_policy, p.kind, p.active_deadline_seconds,
       p.successful_history_limit, p.failed_history_limit,
       extract(epoch FROM now() - r.started_at)::float8 AS age_seconds, r.holds_lock, r.deadline_seconds
FROM scheduling_schedulerun AS r
JOIN scheduling_schedulepolicy AS p ON p.id = r.schedule_id
WHERE r.state = 'running'
ORDER BY r.id;

-- name: close_orphan_run
-- The orphan duty closes one run its worker left without an outcome: conditional on it still
-- being running, so an outcome recorded meanwhile (the run was alive after all) wins.
UPDATE scheduling_schedulerun
SET state = 'failed', error = %(error)s, finished_at = now()
WHERE id = %(id)s AND state = 'running'
RETURNING id;

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
-- latest pruned tick of beat's (beat and catch_up), so a late delivery of a pruned tick is still
-- refused by the gate. A "run now" tick is the wall clock when it was asked: it may be later than
-- a beat tick still waiting in the queue, and a watermark over it would refuse that tick for ever.
-- So it moves no watermark, and its row is kept while its message could still come again (the
-- broker's visibility timeout, %(keep_manual_seconds)s): the row then refuses the late delivery.
WITH ranked AS (
    SELECT id, tick,
           row_number() OVER (PARTITION BY (state = 'succeeded') ORDER BY tick DESC) AS position,
           state = 'succeeded' AS ok
    FROM scheduling_schedulerun
    WHERE schedule_id = %(schedule_id)s AND state <> 'running'
      AND NOT (trigger = 'manual' AND finished_at > now() - make_interval(secs => %(keep_manual_seconds)s))
), victims AS (
    DELETE FROM scheduling_schedulerun AS r
    USING ranked
    WHERE r.id = ranked.id
      AND ranked.position > CASE WHEN ranked.ok THEN %(successful)s::int ELSE %(failed)s::int END
    RETURNING r.tick, r.trigger
), watermark AS (
    UPDATE scheduling_schedulepolicy AS p
    SET pruned_through = greatest(p.pruned_through, (SELECT max(tick) FROM victims WHERE trigger <> 'manual'))
    WHERE p.id = %(schedule_id)s AND EXISTS (SELECT 1 FROM victims WHERE trigger <> 'manual')
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

-- name: kind_paused
-- Whether the kind is paused (scheduling_kindcontrol, the same switch that keeps its due_at jobs
-- pending): the gate then skips the tick with the reason, so a paused kind runs through no door.
SELECT coalesce((SELECT paused FROM scheduling_kindcontrol WHERE kind = %(kind)s), false);

-- name: request_run_abort
-- An operator asks a running run to stop (api.abort_schedule_run): its worker's watcher reads it
-- back (run_abort) and interrupts the handler. The first asker is kept; only a running run is asked.
UPDATE scheduling_schedulerun
SET abort_requested_at = coalesce(abort_requested_at, now()),
    abort_requested_by = CASE WHEN abort_requested_at IS NULL THEN %(by)s ELSE abort_requested_by END
WHERE id = %(id)s AND state = 'running'
RETURNING id;

-- name: run_abort
-- The abort asked for a running run, if any (its worker's watcher polls this every heartbeat interval).
SELECT abort_requested_by AS by, abort_requested_at AS at FROM scheduling_schedulerun
WHERE id = %(id)s AND state = 'running' AND abort_requested_at IS NOT NULL;
