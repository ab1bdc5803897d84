-- An atomic chunk runs its jobs one after another in one transaction, each behind the savepoint
-- tk_job (runner._run_isolated, runner._Statements). A job that sends no statement needs none of
-- these: the savepoint it finds open is still clean when it ends, and the next job uses it. One
-- that wrote and succeeded leaves its savepoint holding its writes; the next savepoint is opened in
-- front of the next statement sent, whichever job sends it. Savepoints are never released (the
-- chunk's COMMIT releases them all). A job that failed (or asked for its rollback) is rolled back to
-- the savepoint it ran behind, by name (store.roll_back_job): its writes go, the savepoint stays
-- open and clean for the next job.

-- name: open_job_savepoint
-- The chunk's first job's savepoint, opened right after the claims are locked (so that rolling
-- a job back never releases them).
SAVEPOINT tk_job;

-- name: check_job
-- After a job that sent statements and succeeded: its deferred constraints (Django creates foreign
-- keys DEFERRABLE INITIALLY DEFERRED) are checked, so a bad reference fails this job and not the
-- chunk's COMMIT. The runner follows it with the next job's savepoint (SAVEPOINT tk_job_<n>, a
-- name of its own: runner._Statements) and sends both in front of the next statement, in the
-- same execute (store.check_job_sql), or alone when the chunk ends first (store.check_job). The
-- check runs in a savepoint of its own that is rolled back: PostgreSQL restores every
-- constraint's mode as it was (SET CONSTRAINTS ALL DEFERRED would also defer the DEFERRABLE
-- INITIALLY IMMEDIATE ones for every later job of the chunk) and marks the checked events pending
-- again, so the COMMIT checks them once more (in the server, no round trip). If a constraint
-- fails, nothing after it runs (neither the savepoint nor the next statement): tk_check is still
-- open, which is how the runner tells that the check failed. If the next statement fails, the
-- new savepoint exists: the statement's own error. If neither exists, nothing after the check's
-- start ran (PostgreSQL parses a query string whole before running any of it): the error took
-- the checked job's savepoint.
SAVEPOINT tk_check;
SET CONSTRAINTS ALL IMMEDIATE;
ROLLBACK TO SAVEPOINT tk_check;
RELEASE SAVEPOINT tk_check;

-- name: refuse_statements
-- The runner rolled a job's failed statement back to its savepoint to learn what had failed; this
-- fails the savepoint again, so the job's next statement is refused as PostgreSQL would have. The
-- error is the cast's: invalid input syntax for type integer, quoting the text below in the log.
SELECT 'timekeeper: an earlier statement of this job failed, its transaction stays failed'::int;

-- name: transaction_settings
-- Before a job's first statement that may change a setting for the rest of the chunk's transaction
-- (SET LOCAL, set_config(..., true); runner._changes_settings): the settings as they are, to put
-- back after it (restore_settings). The role is no row of pg_settings: read on its own, first.
SELECT 'role', current_setting('role')
UNION ALL
SELECT name, setting FROM pg_settings WHERE context IN ('user', 'superuser');

-- name: restore_settings
-- After that job (the chunk ends with it, so no later job sees what it set): what it changed goes
-- back to what it was, for the rest of the transaction (set_config's is_local: SET LOCAL), so the
-- runner's own statements (the check, the outcomes) run with the chunk's role, search path and
-- limits. First no statement limit (each statement of the string gets its own timer: a job's 1 ms
-- would cancel the rest), then the role (a setting only the chunk's role may set is set by it),
-- then every other setting that differs, the limit included. Not restorable, so not tried:
-- transaction_read_only (a read-only transaction cannot be made read-write again),
-- session_authorization (no setting), and a custom setting the job defined first ("app.tenant":
-- no value to go back to; only the runner's own statements would see it).
SELECT set_config('statement_timeout', '0', true);
SELECT set_config('role', %(role)s, true) WHERE %(role)s IS DISTINCT FROM current_setting('role');
SELECT count(set_config(s.name, s.setting, true))
FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(name, setting)
JOIN pg_settings AS p ON p.name = s.name
WHERE p.setting IS DISTINCT FROM s.setting AND s.name <> 'transaction_read_only';
