"""What happens next to a due_at job: one pure function per event, no database.

The lifecycle (docs/architecture.md, "The job lifecycle")::

    pending ──claim──► claimed ──start──► running ──► done
       ▲                  │                  │ ├──► pending (a retry, after its backoff)
       └──── given back ──┘                  │ ├──► dead (attempts spent)
                                             │ └──► cancelled (its owner was deleted)
    pending ──cancel──► cancelled
    claimed ──abort──► cancelled (never started: nothing ran)
    running ──aborted─► cancelled (an operator's abort interrupted its handler; its atomic writes rolled back)

A handler may choose its outcome (``registry.Snooze``, ``RetryAfter``, ``Discard``, ``Cancel``): four
events of their own (``_handler_choice``), written like the others.

``decide(event, facts)`` says what an event does to a job whose row reads ``facts``; ``None`` means
nothing changes (a stale token, or a state the event does not apply to). Every way out of
``claimed`` and ``running`` (the runner's outcomes, the claim's give-back, the sweeper, the
shutdown path, a lost chunk) is decided here and written by one token-conditional statement
(``store.set_job_states``, ``due_at/sql/claim.sql``), which receives for each row the decision for
every combination of the facts the row may have changed meanwhile (``plan``), so nothing is decided
in SQL. One backoff (``registry.Backoff.delay``) gives every retry's delay.

The deleted-owner rule (docs/security.md, "Deleting a user"), one for every path: a job whose owner
was deleted never returns to pending. Nor does an occurrence of a recurrence paused or cancelled
while it was claimed or running (pausing and cancelling give it no retry: its budget becomes its
spent attempts, and ``retired`` on its row); the statement reads that as the same fact. Given
back without having failed (a claim never sent, a worker's shutdown, a message lost, a batch or
chunk that died together and is refunded) it is cancelled; an attempt of its own that failed (a
failure, a timeout, a crash charged to it) was its last, and it is dead.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools

from scheduling.models import AttemptOutcome, JobState


class Event(enum.StrEnum):
    """What happened to a job; each applies to the states of ``FROM_STATES``."""

    SUCCEEDED = "succeeded"  # its handler returned (and its writes, if atomic, committed with it)
    FAILED = "failed"  # its handler raised (or left its transaction broken)
    TIMED_OUT = "timed_out"  # its handler ran past its timeout
    UNSENT = "unsent"  # claimed, never sent (no room in the queue, the broker refused): given back
    RELEASED = "released"  # its handler was running when its worker stopped: given back, the attempt counted
    NOT_STARTED = "not_started"  # its batch's worker stopped before its handler began: given back, not counted
    EXPIRED = "expired"  # claimed, never started within its lease, its message lost with the broker
    CRASHED = "crashed"  # running, its process died (the sweeper) or its chunk's transaction was lost
    CANCEL = "cancel"  # an operator or the API cancels it
    UNKNOWN_KIND = "unknown_kind"  # its worker has no handler for its kind (an old release): given back, later
    RATE_LIMITED = "rate_limited"  # its start found its kind's rate window full past the wait: given back, later
    # A handler's choice (registry.Snooze, RetryAfter, Discard, Cancel); the values are the attempt's outcome.
    SNOOZED = "snoozed"  # run again after the given delay, the attempt not charged
    RETRY_AFTER = "retry_after"  # a failure charged, retried after the given delay instead of the backoff
    DISCARDED = "discarded"  # a permanent failure: dead, whatever attempts are left
    CANCELLED = "cancelled"  # the handler cancels its job
    ABORT = "abort"  # an operator aborts a claim that has not started (api.abort): it ran nothing
    ABORTED = "aborted"  # an operator's abort interrupted its running handler (the runner writes it)


# An outcome is fenced by the claim token: the runner writes it for a started (running) job, and
# a holder of the token may also end a claim it never started (as before the running state).
FROM_STATES: dict[Event, tuple[JobState, ...]] = {
    Event.SUCCEEDED: (JobState.RUNNING, JobState.CLAIMED),
    Event.FAILED: (JobState.RUNNING, JobState.CLAIMED),
    Event.TIMED_OUT: (JobState.RUNNING, JobState.CLAIMED),
    Event.UNSENT: (JobState.CLAIMED,),
    Event.RELEASED: (JobState.CLAIMED, JobState.RUNNING),
    Event.NOT_STARTED: (JobState.RUNNING, JobState.CLAIMED),
    Event.EXPIRED: (JobState.CLAIMED,),
    Event.CRASHED: (JobState.RUNNING,),
    Event.CANCEL: (JobState.PENDING,),
    Event.SNOOZED: (JobState.RUNNING, JobState.CLAIMED),
    Event.RETRY_AFTER: (JobState.RUNNING, JobState.CLAIMED),
    Event.DISCARDED: (JobState.RUNNING, JobState.CLAIMED),
    Event.CANCELLED: (JobState.RUNNING, JobState.CLAIMED),
    Event.UNKNOWN_KIND: (JobState.RUNNING, JobState.CLAIMED),
    Event.RATE_LIMITED: (JobState.RUNNING,),
    Event.ABORT: (JobState.CLAIMED,),
    Event.ABORTED: (JobState.RUNNING,),
}

# Given back without having failed: a deleted owner's job is then cancelled, not dead.
GIVE_BACKS = frozenset(
    {
        Event.UNSENT,
        Event.RELEASED,
        Event.NOT_STARTED,
        Event.EXPIRED,
        Event.SNOOZED,
        Event.UNKNOWN_KIND,
        Event.RATE_LIMITED,
    }
)


class Due(enum.StrEnum):
    """When a job sent back to pending is due."""

    KEEP = "keep"  # its due time stays (long past: due at once)
    BACKOFF = "backoff"  # after the retry delay given with the event (the job's or its kind's backoff)


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the row says when the event is written (the statement reads the changeable ones itself)."""

    state: JobState
    token_matches: bool = True  # the caller's claim token is the row's: False for a claim taken back
    attempts: int = 1  # attempts made, this one included (the claim counts it)
    max_attempts: int = 3
    owner_deleted: bool = False  # former_owner set (api.retire_owner), or retired by its recurrence's pause
    run_alone: bool = False  # its batch died with its process once: it runs in a batch of its own
    together: bool = False  # CRASHED: it died with other unfinished jobs of its batch or chunk
    key_released: bool = False  # keyed and started: out of its key's index, where a successor may now wait

    @property
    def spent(self) -> bool:
        return self.attempts >= self.max_attempts


@dataclasses.dataclass(frozen=True)
class Decision:
    """The next state of one job and what comes with it."""

    state: JobState
    due: Due = Due.KEEP  # when ``state`` is pending
    record: AttemptOutcome | None = None  # the attempt row written (None: none, the claim ran nothing)
    refund: bool = False  # the attempt is not charged: max_attempts grows by one
    uncount: bool = False  # the claim's attempt is given back (attempts - 1)
    run_alone: bool = False  # flag the job to run in a batch of its own from now on
    keep_claim: bool = False  # done: the token, claimed_at and claimed_by stay for the record

    @property
    def finished(self) -> bool:
        return self.state in (JobState.DONE, JobState.CANCELLED, JobState.DEAD)


def decide(event: Event, facts: Facts) -> Decision | None:
    """The decision for ``event`` on a row reading ``facts``; None: nothing changes."""
    if not facts.token_matches or facts.state not in FROM_STATES[event]:
        return None
    if event == Event.CANCEL:
        return Decision(JobState.CANCELLED)
    if event == Event.ABORT:  # the claim's attempt is given back: nothing ran
        return Decision(JobState.CANCELLED, uncount=True)
    if event == Event.ABORTED:  # cancelled whatever its attempts or owner: an operator asked it to stop
        return Decision(JobState.CANCELLED, record=AttemptOutcome.ABORTED)
    if event == Event.SUCCEEDED:
        return Decision(JobState.DONE, record=AttemptOutcome.SUCCEEDED, keep_claim=True)
    if event in (Event.UNSENT, Event.NOT_STARTED):
        # It ran nothing (never sent; or its batch's worker stopped before its handler began, a
        # deploy): the claim's attempt is given back, so a deploy costs no job an attempt.
        return _back(facts, Decision(JobState.PENDING, uncount=True), give_back=True)
    if event in (Event.UNKNOWN_KIND, Event.RATE_LIMITED):
        # It ran nothing: uncharged, due after the given delay (old workers do not loop hot; a full
        # rate window has room again by then)
        return _back(facts, Decision(JobState.PENDING, due=Due.BACKOFF, uncount=True), give_back=True)
    if event in _HANDLER_CHOICES:
        return _handler_choice(event, facts)
    if event in (Event.FAILED, Event.TIMED_OUT):
        record = AttemptOutcome(event.value)
        if facts.spent:
            return Decision(JobState.DEAD, record=record)
        return _back(facts, Decision(JobState.PENDING, due=Due.BACKOFF, record=record), give_back=False)
    if event == Event.RELEASED:
        if facts.owner_deleted:
            return Decision(JobState.CANCELLED, record=AttemptOutcome.RECLAIMED)
        state = JobState.DEAD if facts.spent else JobState.PENDING
        return Decision(state, record=AttemptOutcome.RECLAIMED)
    if event == Event.EXPIRED:
        if facts.owner_deleted:
            return Decision(JobState.CANCELLED, record=AttemptOutcome.RECLAIMED)
        state = JobState.DEAD if facts.spent else JobState.PENDING
        return Decision(state, record=AttemptOutcome.RECLAIMED)
    # CRASHED: nothing says which job of a batch that died together was to blame, so none of them is
    # charged (refunded once, then it runs alone); a job that ran alone is charged the crash.
    if facts.together and not facts.run_alone:
        refunded = Decision(
            JobState.PENDING, due=Due.BACKOFF, record=AttemptOutcome.RECLAIMED, refund=True, run_alone=True
        )
        return _back(facts, refunded, give_back=True)
    if facts.spent:
        return Decision(JobState.DEAD, record=AttemptOutcome.RECLAIMED, run_alone=True)
    return _back(
        facts,
        Decision(JobState.PENDING, due=Due.BACKOFF, record=AttemptOutcome.RECLAIMED, run_alone=True),
        give_back=False,
    )


_HANDLER_CHOICES = frozenset({Event.SNOOZED, Event.RETRY_AFTER, Event.DISCARDED, Event.CANCELLED})


def _handler_choice(event: Event, facts: Facts) -> Decision:
    """A handler's chosen outcome (docs/architecture.md, "Handler-chosen outcomes").

    SNOOZED: pending after its delay, the claim's attempt given back (a snooze is no attempt; how
    many a job may take is the runner's check, before this event); a deleted owner's job is then
    cancelled, as for every give-back. RETRY_AFTER: a failure, charged (dead when spent, or when
    its owner was deleted), due after its delay. DISCARDED: dead. CANCELLED: cancelled.
    """
    record = AttemptOutcome(event.value)
    if event == Event.SNOOZED:
        return _back(facts, Decision(JobState.PENDING, due=Due.BACKOFF, record=record, uncount=True), give_back=True)
    if event == Event.RETRY_AFTER:
        if facts.spent:
            return Decision(JobState.DEAD, record=record)
        return _back(facts, Decision(JobState.PENDING, due=Due.BACKOFF, record=record), give_back=False)
    if event == Event.DISCARDED:
        return Decision(JobState.DEAD, record=record)
    return Decision(JobState.CANCELLED, record=record)


def _back(facts: Facts, decision: Decision, *, give_back: bool) -> Decision:
    """``decision`` sends the job back to pending: unless its owner was deleted (the one rule, above).

    A running job's key may have a waiting successor (the key's index covers waiting jobs only:
    pending on their first attempt, or claimed and not started). Given back uncharged, the job
    would be such a waiting job again and could meet it in the index: a keyed job that started is
    refunded instead (its attempt stays counted and ``max_attempts`` grows by one), so it comes
    back as a retry, uncharged all the same. Whether a successor waits is not asked: one whose
    insert has not committed is invisible, and its commit would fail the transition.
    """
    if facts.owner_deleted:
        state = JobState.CANCELLED if give_back else JobState.DEAD
        return dataclasses.replace(decision, state=state, due=Due.KEEP)
    if decision.uncount and facts.key_released:
        return dataclasses.replace(decision, uncount=False, refund=True)
    return decision


def expired(state: JobState, run_alone: bool, batch_rows: int, batch_shared: bool) -> tuple[Event, bool, str]:
    """The sweeper's event for an expired claim: (event, died together, the error it records).

    A claim never started ran nothing (EXPIRED, its message lost). A running one died with its
    process (CRASHED): together when other rows of its batch are still running, or when an earlier
    statement of the same sweep found its batch shared (``batch_shared``; a batch cut by a LIMIT).
    """
    if state != JobState.RUNNING:
        return Event.EXPIRED, False, "claim expired: never started, and its message is no longer queued"
    if not run_alone and (batch_rows > 1 or batch_shared):
        return (
            Event.CRASHED,
            True,
            f"claim expired: its process stopped while running a batch of {batch_rows} jobs; "
            "not counted against max_attempts, the job runs alone next",
        )
    return Event.CRASHED, False, "claim expired: the worker stopped heartbeating"


# --- What the transition statement receives --------------------------------------------------------

# The facts a row may change while its holder decides (api.retire_owner sets former_owner and
# max_attempts on a running job; run_alone is read with the row): the statement looks each row up
# in its event's plan by these, as index spent * 4 + owner_deleted * 2 + run_alone. A second plan
# of the same event holds the decisions for a keyed row that started (``key_released``): the
# statement reads it off the row and adds 8 (``plans``).
BRANCHES: tuple[tuple[bool, bool, bool], ...] = tuple(itertools.product((False, True), (False, True), (False, True)))


def branch_facts(
    event: Event, spent: bool, owner_deleted: bool, run_alone: bool, together: bool, key_released: bool = False
) -> Facts:
    """Facts for one branch of a plan (attempts 1 of 1 when spent, 1 of 2 otherwise)."""
    return Facts(
        state=FROM_STATES[event][0],
        attempts=1,
        max_attempts=1 if spent else 2,
        owner_deleted=owner_deleted,
        run_alone=run_alone,
        together=together,
        key_released=key_released,
    )


def plan(event: Event, *, together: bool = False, key_released: bool = False) -> list[Decision]:
    """The decision of ``event`` for every branch of ``BRANCHES``, in that order (the statement indexes it)."""
    out = []
    for spent, owner_deleted, run_alone in BRANCHES:
        decision = decide(event, branch_facts(event, spent, owner_deleted, run_alone, together, key_released))
        assert decision is not None  # the branch facts are in the event's state, under the token
        out.append(decision)
    return out


def plans(event: Event, *, together: bool = False) -> list[Decision]:
    """What the transition statement receives: ``plan`` without, then with, ``key_released``."""
    return plan(event, together=together) + plan(event, together=together, key_released=True)


def encoded(decisions: list[Decision]) -> list[dict[str, object]]:
    """A plan as the statement reads it (JSON): state, due, record, refund, uncount, run_alone, keep_claim."""
    return [
        {
            "state": d.state.value,
            "finished": d.finished,
            "backoff": d.state == JobState.PENDING and d.due == Due.BACKOFF,
            "record": None if d.record is None else d.record.value,
            "refund": d.refund,
            "uncount": d.uncount,
            "run_alone": d.run_alone,
            "keep_claim": d.keep_claim,
        }
        for d in decisions
    ]
