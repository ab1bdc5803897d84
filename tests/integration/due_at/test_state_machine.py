"""A hypothesis state machine over a job's life against real PostgreSQL: the store's conditional UPDATEs.

Rules: schedule (with or without a key), cancel, reschedule, claim, unclaim, start, heartbeat,
complete, fail and release (each with the current claim token or a stale one), crash (the holder vanishes:
its heartbeat is moved back past the lease, time travel in the database), sweep, and retry a dead
job. A plain Python model predicts every answer; after every step the rows must match it and:

- a job is in exactly one state, and done / cancelled / dead never change again (except an
  explicit retry of a dead job);
- a key has at most one first-attempt waiting job (pending and never run, or claimed and not yet
  started); a running job is never touched by a keyed schedule, whose successor waits beside it,
  and no path (fail, release, sweep, unclaim, retry) ever meets the unique index;
- attempts never exceed max_attempts; a dead job spent exactly max_attempts;
- never two live claims: a claimed row carries the one token of its latest claim, tokens are
  never reused, and a stale token never starts, heartbeats, completes, fails or releases anything;
- every attempt that ended is recorded once, a done job has exactly one succeeded attempt, made
  under the token it was claimed with.

At the end every live job is driven to a final state through crashes and sweeps alone: it ends
dead after max_attempts, never looping.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from scheduling import api, exceptions
from scheduling.due_at import store
from scheduling.models import AttemptOutcome, JobState

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "demo.noop"  # lease: the default 60 s; a step sequence runs in well under a second
FINAL = {JobState.DONE, JobState.CANCELLED, JobState.DEAD}
KEYS = ("trial-ending:1",)  # one business key: keyed schedules collide with the live job often
TOKEN_CHOICES = st.sampled_from(["current", "current", "stale", "unknown"])  # mostly the live claim's token


@dataclasses.dataclass
class ModelJob:
    """What the rows of one job must say, as the model predicts it."""

    max_attempts: int
    key: str | None
    due: bool
    state: str = JobState.PENDING
    attempts: int = 0
    token: str | None = None  # the current claim's token (kept after done, like the row)
    started: bool = False
    expired: bool = False  # crashed: its heartbeat was moved back past the lease
    tokens: list[str] = dataclasses.field(default_factory=list)  # every token it was ever claimed with
    ended_attempts: int = 0  # JobAttempt rows expected
    final_seen: str | None = None


def _sql(statement: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def _refused(expected: type[exceptions.JobStateConflict], call: Callable[[], object]) -> exceptions.JobStateConflict:
    """The conflict ``call`` raised; an AssertionError (a plain failure for hypothesis) if it went through."""
    try:
        call()
    except expected as conflict:
        return conflict
    raise AssertionError(f"expected {expected.__name__}: the change went through")


def _when(due: bool) -> dt.datetime:
    """A due time an hour in the past (due) or in the future (not due), far from any clock difference."""
    return dt.datetime.now(dt.UTC) + dt.timedelta(hours=-1 if due else 1)


def _row_state(job: ModelJob) -> JobState:
    """The row's state for the model's job: the model's claim is running once a worker started it."""
    return JobState.RUNNING if job.state == JobState.CLAIMED and job.started else job.state


class JobLifeMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        _sql("DELETE FROM scheduling_jobattempt")
        _sql("DELETE FROM scheduling_scheduledjob")
        self.model: dict[int, ModelJob] = {}
        self.all_tokens: set[str] = set()

    # --- helpers ----------------------------------------------------------------------------------

    def _token(self, job: ModelJob, choice: str) -> str:
        stale = [t for t in job.tokens if t != job.token]
        if choice == "current" and job.token is not None:
            return job.token
        if choice in ("current", "stale") and stale:
            return stale[-1]
        return str(uuid.uuid4())

    def _holds(self, job: ModelJob, token: str) -> bool:
        """Whether ``token`` is the live claim on ``job``: only then may it change anything."""
        return job.state == JobState.CLAIMED and token == job.token

    def _end_attempt(self, job: ModelJob, *, to_pending_unless_spent: bool) -> None:
        job.ended_attempts += 1
        job.started = job.expired = False
        if to_pending_unless_spent:
            job.state = JobState.DEAD if job.attempts >= job.max_attempts else JobState.PENDING
            job.token = None

    def _first_waiting(self, key: str) -> int | None:
        """The key's job in the unique index: pending and never run, or claimed on attempt 1 and not started."""
        waiting = [
            i
            for i, j in self.model.items()
            if j.key == key
            and (
                (j.state == JobState.PENDING and j.attempts == 0)
                or (j.state == JobState.CLAIMED and not j.started and j.attempts == 1)
            )
        ]
        assert len(waiting) <= 1
        return waiting[0] if waiting else None

    def _pending_retry(self, key: str) -> int | None:
        """The key's newest pending retry (a started attempt ended and it waits again)."""
        retries = [i for i, j in self.model.items() if j.key == key and j.state == JobState.PENDING and j.attempts > 0]
        return max(retries) if retries else None

    def _ever_claimed(self) -> list[int]:
        return sorted(i for i, j in self.model.items() if j.tokens)

    def _pick(self, data: st.DataObject) -> int:
        """A job that was claimed at least once, the live claims first (tokens matter most there)."""
        live = sorted(i for i, j in self.model.items() if j.state == JobState.CLAIMED)
        return data.draw(
            st.sampled_from(live) if live and data.draw(st.booleans()) else st.sampled_from(self._ever_claimed())
        )

    def _outcome(self, job_id: int, token: str) -> store.Outcome:
        now = dt.datetime.now(dt.UTC)
        return store.Outcome(job_id, token, now, now, AttemptOutcome.FAILED, "failed in the model", 0.0)

    # --- rules ------------------------------------------------------------------------------------

    @initialize(target=jobs, max_attempts=st.integers(1, 3))
    def a_due_job(self, max_attempts: int) -> int:
        """Every run starts with a keyed due job, claimed and started, so the token and key rules have work."""
        job_id = self.schedule_keyed(key=KEYS[0], due=True, max_attempts=max_attempts)
        self.claim(limit=1)
        job = self.model[job_id]
        assert [s.id for s in store.start_jobs([(job_id, job.token)], "model:1")] == [job_id]
        job.started = True
        assert store.start_jobs([(job_id, job.token)], "model:2") == [], "a redelivered batch runs nothing"
        successor = self.schedule_keyed(key=KEYS[0], due=False, max_attempts=1)
        assert successor != job_id, "a running job is not replaced: its successor waits beside it"
        return job_id

    @rule(target=jobs, due=st.booleans(), max_attempts=st.integers(1, 3))
    def schedule(self, due: bool, max_attempts: int) -> int:
        job = api.schedule(KIND, {}, due_at=_when(due), max_attempts=max_attempts)
        assert job.id not in self.model
        self.model[job.id] = ModelJob(max_attempts=max_attempts, key=None, due=due)
        return job.id

    @rule(target=jobs, key=st.sampled_from(KEYS), due=st.booleans(), max_attempts=st.integers(1, 3))
    def schedule_keyed(self, key: str, due: bool, max_attempts: int) -> int:
        waiting, retry = self._first_waiting(key), self._pending_retry(key)
        job = api.schedule(KIND, {}, due_at=_when(due), key=key, max_attempts=max_attempts)
        if waiting is not None:  # replace: the waiting job moves; a claim not yet started is taken back
            assert job.id == waiting
            moved = self.model[waiting]
            if moved.state == JobState.CLAIMED:
                moved.state, moved.token, moved.attempts, moved.expired = JobState.PENDING, None, 0, False
            moved.due = due
            moved.max_attempts = max_attempts
            return waiting
        if retry is not None:  # replace: the pending retry moves, with a budget for at least one more try
            assert job.id == retry
            moved = self.model[retry]
            moved.due = due
            moved.max_attempts = max(max_attempts, moved.attempts + 1)
            return retry
        assert job.id not in self.model, "with nothing waiting (the key free or only running), a new job"
        self.model[job.id] = ModelJob(max_attempts=max_attempts, key=key, due=due)
        return job.id

    @rule(job_id=jobs)
    def cancel(self, job_id: int) -> None:
        job = self.model[job_id]
        if job.state == JobState.PENDING:
            assert api.cancel(job_id) == job_id
            job.state = JobState.CANCELLED
        else:
            assert _refused(exceptions.JobNotCancellable, lambda: api.cancel(job_id)).state == _row_state(job)

    @rule(job_id=jobs, due=st.booleans())
    def reschedule(self, job_id: int, due: bool) -> None:
        job = self.model[job_id]
        when = _when(due)
        if job.state == JobState.PENDING:
            assert api.reschedule(job_id, due_at=when) == when
            job.due = due
        else:
            refused = _refused(exceptions.JobNotReschedulable, lambda: api.reschedule(job_id, due_at=when))
            assert refused.state == _row_state(job)

    @rule(limit=st.integers(1, 4))
    def claim(self, limit: int) -> None:
        due = {i for i, j in self.model.items() if j.state == JobState.PENDING and j.due}
        claims = store.claim_due_jobs(limit)
        got = {c.id for c in claims}
        assert len(got) == len(claims) == min(limit, len(due)), "SKIP LOCKED claim takes due rows, each once"
        assert got <= due, "only pending rows that are due by the database clock"
        for c in claims:
            job = self.model[c.id]
            assert c.token not in self.all_tokens, "a claim token is never reused"
            self.all_tokens.add(c.token)
            job.state, job.token, job.started, job.expired = JobState.CLAIMED, c.token, False, False
            job.attempts += 1
            job.tokens.append(c.token)
            if len(job.tokens) > 1:
                self._stale_token_changes_nothing(c.id, job.tokens[-2])

    @precondition(lambda self: self._ever_claimed())
    @rule(data=st.data(), choice=TOKEN_CHOICES)
    def unclaim(self, data: st.DataObject, choice: str) -> None:
        """The claim could not send its batch: a claim not yet started goes back, its attempt given back."""
        job_id = self._pick(data)
        job = self.model[job_id]
        token = self._token(job, choice)
        back = store.unclaim_jobs([(job_id, token)])
        if self._holds(job, token) and not job.started:
            assert back == [job_id]
            job.state, job.token, job.attempts, job.expired = JobState.PENDING, None, job.attempts - 1, False
        else:
            assert back == []

    def _stale_token_changes_nothing(self, job_id: int, stale: str) -> None:
        """Right after a re-claim, the previous holder's token can do nothing at all."""
        assert store.start_jobs([(job_id, stale)], "late:1") == []
        assert store.heartbeat_jobs([(job_id, stale)]) == []
        now = dt.datetime.now(dt.UTC)
        assert store.complete_jobs([store.Outcome(job_id, stale, now, now, AttemptOutcome.SUCCEEDED)]) == []
        assert store.fail_jobs([self._outcome(job_id, stale)]) == []
        assert store.release_jobs([(job_id, stale)], "late") == []

    @precondition(lambda self: self._ever_claimed())
    @rule(data=st.data(), choice=TOKEN_CHOICES)
    def start(self, data: st.DataObject, choice: str) -> None:
        job_id = self._pick(data)
        job = self.model[job_id]
        token = self._token(job, choice)
        started = store.start_jobs([(job_id, token)], "model:1")
        if self._holds(job, token) and not job.started:
            assert [s.id for s in started] == [job_id]
            job.started = True
            job.expired = False  # starting refreshes the heartbeat
            assert store.start_jobs([(job_id, token)], "model:2") == [], "a redelivered batch runs nothing"
        else:
            assert started == [], "a stale token, or a claim already started, runs nothing"

    @precondition(lambda self: self._ever_claimed())
    @rule(data=st.data(), choice=TOKEN_CHOICES)
    def heartbeat(self, data: st.DataObject, choice: str) -> None:
        job_id = self._pick(data)
        job = self.model[job_id]
        token = self._token(job, choice)
        alive = [r.id for r in store.heartbeat_jobs([(job_id, token)])]
        held = self._holds(job, token) and job.started
        assert alive == ([job_id] if held else []), "only started claims have a lease to renew"
        if alive:
            job.expired = False

    @precondition(lambda self: self._ever_claimed())
    @rule(data=st.data(), choice=TOKEN_CHOICES)
    def complete(self, data: st.DataObject, choice: str) -> None:
        job_id = self._pick(data)
        job = self.model[job_id]
        token = self._token(job, choice)
        now = dt.datetime.now(dt.UTC)
        done = store.complete_jobs([store.Outcome(job_id, token, now, now, AttemptOutcome.SUCCEEDED)])
        if self._holds(job, token):
            assert done == [job_id]
            self._end_attempt(job, to_pending_unless_spent=False)
            job.state = JobState.DONE
        else:
            assert done == [], "a stale token never completes"

    @precondition(lambda self: self._ever_claimed())
    @rule(data=st.data(), choice=TOKEN_CHOICES)
    def fail(self, data: st.DataObject, choice: str) -> None:
        job_id = self._pick(data)
        job = self.model[job_id]
        token = self._token(job, choice)
        moved = store.fail_jobs([self._outcome(job_id, token)])
        if self._holds(job, token):
            self._end_attempt(job, to_pending_unless_spent=True)
            job.due = True  # retried after a backoff of 0 s
            assert [(m.id, m.state) for m in moved] == [(job_id, job.state)]
        else:
            assert moved == []

    @precondition(lambda self: self._ever_claimed())
    @rule(data=st.data(), choice=TOKEN_CHOICES)
    def release(self, data: st.DataObject, choice: str) -> None:
        job_id = self._pick(data)
        job = self.model[job_id]
        token = self._token(job, choice)
        released = store.release_jobs([(job_id, token)], "worker shutting down")
        if self._holds(job, token):
            self._end_attempt(job, to_pending_unless_spent=True)
            assert [(r.id, r.state) for r in released] == [(job_id, job.state)]
        else:
            assert released == []

    @precondition(lambda self: any(j.state == JobState.CLAIMED and not j.expired for j in self.model.values()))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """The worker holding a claim (started or not) vanishes: time passes beyond the lease, no heartbeat."""
        live = sorted(i for i, j in self.model.items() if j.state == JobState.CLAIMED and not j.expired)
        job_id = data.draw(st.sampled_from(live))
        _sql(
            "UPDATE scheduling_scheduledjob SET heartbeat_at = now() - make_interval(secs => lease_seconds + 1),"
            " claimed_at = now() - make_interval(secs => lease_seconds + 1) WHERE id = %s",
            [job_id],
        )
        self.model[job_id].expired = True

    @rule()
    def sweep(self) -> None:
        expired = {i for i, j in self.model.items() if j.state == JobState.CLAIMED and j.expired}
        # no message is queued here: every claim never started is missing (as at a sweep before)
        confirmed = store.unseen_unstarted_claims([], limit=10_000)
        moved = store.sweep_expired_claims(
            heartbeats=True, sweep_after_seconds=900, limit=500, queued_ids=[], confirmed=confirmed
        )
        assert {m.id for m in moved} == expired, "the sweeper takes back exactly the claims past their lease"
        for moved_job in moved:
            job = self.model[moved_job.id]
            assert not moved_job.refunded, "each crash here is a batch of one: charged to its job"
            if job.started:
                job.due = False  # a crash is retried after the kind's backoff, not at once
            self._end_attempt(job, to_pending_unless_spent=True)
            assert moved_job.state == job.state

    @rule(job_id=jobs)
    def retry_dead(self, job_id: int) -> None:
        job = self.model[job_id]
        key_taken = job.key is not None and any(
            j.key == job.key and (j.state == JobState.PENDING or (j.state == JobState.CLAIMED and not j.started))
            for j in self.model.values()
        )
        retried = store.retry_dead_jobs([job_id])
        if job.state == JobState.DEAD and not key_taken:
            assert retried == [job_id]
            job.state, job.attempts, job.token, job.due, job.final_seen = JobState.PENDING, 0, None, True, None
        else:
            assert retried == []

    # --- invariants -------------------------------------------------------------------------------

    @invariant()
    def rows_match_the_model(self) -> None:
        rows = _sql(
            "SELECT id, state, attempts, max_attempts, token::text, claimed_by <> '' FROM scheduling_scheduledjob"
        )
        assert {r[0] for r in rows} == set(self.model)
        for job_id, state, attempts, max_attempts, token, started in rows:
            job = self.model[job_id]
            assert (state, attempts, max_attempts) == (_row_state(job), job.attempts, job.max_attempts), job_id
            assert attempts <= max_attempts
            if state in (JobState.CLAIMED, JobState.RUNNING):
                assert token == job.token, "a claimed row carries its latest claim's token"
                assert started == job.started
            if state == JobState.PENDING:
                assert token is None
            if state == JobState.DEAD:
                assert attempts == max_attempts, "dead only when the attempts are spent"

    @invariant()
    def one_waiting_job_per_key(self) -> None:
        for key in KEYS:
            self._first_waiting(key)  # asserts at most one

    @invariant()
    def final_states_never_change(self) -> None:
        for job in self.model.values():
            if job.final_seen is not None:
                assert job.state == job.final_seen
            elif job.state in FINAL:
                job.final_seen = job.state

    @invariant()
    def attempts_are_recorded_once(self) -> None:
        rows = _sql("SELECT job_id, number, outcome, token::text FROM scheduling_jobattempt")
        per_job: dict[int, list[tuple[int, str, str]]] = {}
        for job_id, number, outcome, token in rows:
            per_job.setdefault(job_id, []).append((number, outcome, token))
        for job_id, job in self.model.items():
            attempts = per_job.get(job_id, [])
            assert len(attempts) == job.ended_attempts, job_id
            succeeded = [a for a in attempts if a[1] == AttemptOutcome.SUCCEEDED]
            assert len(succeeded) == (1 if job.state == JobState.DONE else 0)
            if succeeded:
                assert succeeded[0][2] == job.token, "the success was recorded under the live claim's token"
            assert {a[2] for a in attempts} <= set(job.tokens), "attempts only under tokens this job was given"

    def teardown(self) -> None:
        """Crash every claim until nothing is live: each job reaches one final state within its attempts."""
        try:
            self.rows_match_the_model()
        except AssertionError:
            return  # a step already failed (teardown runs anyway): let hypothesis report that step
        for _ in range(10):
            if all(j.state in FINAL for j in self.model.values()):
                break
            _sql("UPDATE scheduling_scheduledjob SET due_at = now() - interval '1 hour' WHERE state = 'pending'")
            for job in self.model.values():
                job.due = job.due or job.state == JobState.PENDING
            self.claim(limit=500)
            for job_id, job in self.model.items():
                if job.state == JobState.CLAIMED and not job.expired:
                    _sql(
                        "UPDATE scheduling_scheduledjob SET heartbeat_at = now() - interval '1 hour',"
                        " claimed_at = now() - interval '1 hour' WHERE id = %s",
                        [job_id],
                    )
                    job.expired = True
            self.sweep()
            self.rows_match_the_model()
            self.attempts_are_recorded_once()
        assert all(j.state in FINAL for j in self.model.values()), "every job ends in a final state"
        assert all(j.attempts == j.max_attempts for j in self.model.values() if j.state == JobState.DEAD)


def test_job_life_state_machine():
    """Random schedule/cancel/reschedule/claim/complete/crash/sweep sequences keep every invariant of a job's life."""
    run_state_machine_as_test(
        JobLifeMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
