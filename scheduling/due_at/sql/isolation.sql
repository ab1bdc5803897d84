-- An atomic chunk runs its jobs one after another in one transaction, each behind the savepoint
-- tk_job (runner._Isolation). A job that sends no statement needs none of these: the savepoint it
-- finds open is still clean when it ends, and the next job uses it. Savepoints are never released
-- (the chunk's COMMIT releases them all); a name defined again nests, and ROLLBACK TO takes the
-- innermost.

-- name: open_job_savepoint
-- The chunk's first job's savepoint, opened right after the claims are locked (so that rolling
-- a job back never releases them).
SAVEPOINT tk_job;

-- name: check_job_open_next
-- After a job that sent statements and succeeded, in one round trip: its deferred constraints
-- (Django creates foreign keys DEFERRABLE INITIALLY DEFERRED) are checked now, so a bad reference
-- fails this job and not the chunk's COMMIT; then the next job's savepoint is opened. The check
-- runs in a savepoint of its own that is rolled back: PostgreSQL restores every constraint's mode
-- as it was (SET CONSTRAINTS ALL DEFERRED would also defer the DEFERRABLE INITIALLY IMMEDIATE
-- ones for every later job of the chunk) and marks the checked events pending again, so the
-- COMMIT checks them once more (in the server, no round trip). If a constraint fails, nothing
-- after it runs: the runner rolls back to the job's savepoint.
SAVEPOINT tk_check;
SET CONSTRAINTS ALL IMMEDIATE;
ROLLBACK TO SAVEPOINT tk_check;
RELEASE SAVEPOINT tk_check;
SAVEPOINT tk_job;

-- name: roll_back_job
-- A job that sent statements failed (or asked for its rollback): its writes go, the savepoint
-- stays open and clean for the next job.
ROLLBACK TO SAVEPOINT tk_job;
