"""The job lifecycle's decisions (``scheduling.due_at.lifecycle``): every state x event, without PostgreSQL."""

from __future__ import annotations

import random

import pytest

from scheduling.core import registry
from scheduling.due_at import lifecycle
from scheduling.due_at.lifecycle import Decision, Due, Event, Facts
from scheduling.models import AttemptOutcome, JobState

E = Event
S = JobState
O = AttemptOutcome  # noqa: E741 (a short alias for the table below)

LEFT = Facts(S.RUNNING, attempts=1, max_attempts=3)  # attempts left
SPENT = Facts(S.RUNNING, attempts=3, max_attempts=3)
CLAIMED_LEFT = Facts(S.CLAIMED, attempts=1, max_attempts=3)
CLAIMED_SPENT = Facts(S.CLAIMED, attempts=3, max_attempts=3)
RETIRED = Facts(S.RUNNING, attempts=2, max_attempts=2, owner_deleted=True)  # retire_owner: this attempt is the last
CLAIMED_RETIRED = Facts(S.CLAIMED, attempts=1, max_attempts=3, owner_deleted=True)

BACKOFF = Decision(S.PENDING, due=Due.BACKOFF)

CASES = [
    # event, facts, expected decision
    (E.SUCCEEDED, LEFT, Decision(S.DONE, record=O.SUCCEEDED, keep_claim=True)),
    (E.SUCCEEDED, SPENT, Decision(S.DONE, record=O.SUCCEEDED, keep_claim=True)),
    (E.SUCCEEDED, RETIRED, Decision(S.DONE, record=O.SUCCEEDED, keep_claim=True)),
    (E.FAILED, LEFT, Decision(S.PENDING, due=Due.BACKOFF, record=O.FAILED)),
    (E.FAILED, SPENT, Decision(S.DEAD, record=O.FAILED)),
    (E.FAILED, RETIRED, Decision(S.DEAD, record=O.FAILED)),
    (E.TIMED_OUT, LEFT, Decision(S.PENDING, due=Due.BACKOFF, record=O.TIMED_OUT)),
    (E.TIMED_OUT, SPENT, Decision(S.DEAD, record=O.TIMED_OUT)),
    (E.TIMED_OUT, RETIRED, Decision(S.DEAD, record=O.TIMED_OUT)),
    (E.UNSENT, CLAIMED_LEFT, Decision(S.PENDING, uncount=True)),
    (E.UNSENT, CLAIMED_SPENT, Decision(S.PENDING, uncount=True)),
    (E.UNSENT, CLAIMED_RETIRED, Decision(S.CANCELLED, uncount=True)),
    # a worker without the kind's handler (an old release) gives the claim back uncharged, due later
    (E.UNKNOWN_KIND, LEFT, Decision(S.PENDING, due=Due.BACKOFF, uncount=True)),
    (E.UNKNOWN_KIND, SPENT, Decision(S.PENDING, due=Due.BACKOFF, uncount=True)),
    (E.UNKNOWN_KIND, CLAIMED_LEFT, Decision(S.PENDING, due=Due.BACKOFF, uncount=True)),
    (E.UNKNOWN_KIND, RETIRED, Decision(S.CANCELLED, uncount=True)),
    # a rate-limited job whose start permit found no room within the wait: given back uncharged, due later
    (E.RATE_LIMITED, LEFT, Decision(S.PENDING, due=Due.BACKOFF, uncount=True)),
    (E.RATE_LIMITED, SPENT, Decision(S.PENDING, due=Due.BACKOFF, uncount=True)),
    (E.RATE_LIMITED, RETIRED, Decision(S.CANCELLED, uncount=True)),
    (E.NOT_STARTED, LEFT, Decision(S.PENDING, uncount=True)),
    (E.NOT_STARTED, SPENT, Decision(S.PENDING, uncount=True)),
    (E.NOT_STARTED, RETIRED, Decision(S.CANCELLED, uncount=True)),
    (E.NOT_STARTED, CLAIMED_SPENT, Decision(S.PENDING, uncount=True)),
    (E.RELEASED, LEFT, Decision(S.PENDING, record=O.RECLAIMED)),
    (E.RELEASED, SPENT, Decision(S.DEAD, record=O.RECLAIMED)),
    (E.RELEASED, RETIRED, Decision(S.CANCELLED, record=O.RECLAIMED)),
    (E.RELEASED, CLAIMED_LEFT, Decision(S.PENDING, record=O.RECLAIMED)),
    (E.EXPIRED, CLAIMED_LEFT, Decision(S.PENDING, record=O.RECLAIMED)),
    (E.EXPIRED, CLAIMED_SPENT, Decision(S.DEAD, record=O.RECLAIMED)),
    (E.EXPIRED, CLAIMED_RETIRED, Decision(S.CANCELLED, record=O.RECLAIMED)),
    # a crash charged to the job (it ran alone, or was the last unfinished row of its batch)
    (E.CRASHED, LEFT, Decision(S.PENDING, due=Due.BACKOFF, record=O.RECLAIMED, run_alone=True)),
    (E.CRASHED, SPENT, Decision(S.DEAD, record=O.RECLAIMED, run_alone=True)),
    (E.CRASHED, RETIRED, Decision(S.DEAD, record=O.RECLAIMED, run_alone=True)),
    # a batch (or chunk) that died together: refunded once, then it runs alone
    (
        E.CRASHED,
        Facts(S.RUNNING, attempts=3, max_attempts=3, together=True),
        Decision(S.PENDING, due=Due.BACKOFF, record=O.RECLAIMED, refund=True, run_alone=True),
    ),
    (
        E.CRASHED,
        Facts(S.RUNNING, attempts=3, max_attempts=3, together=True, run_alone=True),
        Decision(S.DEAD, record=O.RECLAIMED, run_alone=True),
    ),
    (
        E.CRASHED,
        Facts(S.RUNNING, attempts=2, max_attempts=2, together=True, owner_deleted=True),
        Decision(S.CANCELLED, record=O.RECLAIMED, refund=True, run_alone=True),
    ),
    (E.CANCEL, Facts(S.PENDING), Decision(S.CANCELLED)),
    # a handler's choice (registry.Snooze, RetryAfter, Discard, Cancel)
    (E.SNOOZED, LEFT, Decision(S.PENDING, due=Due.BACKOFF, record=O.SNOOZED, uncount=True)),
    (E.SNOOZED, SPENT, Decision(S.PENDING, due=Due.BACKOFF, record=O.SNOOZED, uncount=True)),
    (E.SNOOZED, CLAIMED_LEFT, Decision(S.PENDING, due=Due.BACKOFF, record=O.SNOOZED, uncount=True)),
    (E.SNOOZED, RETIRED, Decision(S.CANCELLED, record=O.SNOOZED, uncount=True)),
    (E.SNOOZED, CLAIMED_RETIRED, Decision(S.CANCELLED, record=O.SNOOZED, uncount=True)),
    (E.RETRY_AFTER, LEFT, Decision(S.PENDING, due=Due.BACKOFF, record=O.RETRY_AFTER)),
    (E.RETRY_AFTER, SPENT, Decision(S.DEAD, record=O.RETRY_AFTER)),
    (E.RETRY_AFTER, CLAIMED_LEFT, Decision(S.PENDING, due=Due.BACKOFF, record=O.RETRY_AFTER)),
    (E.RETRY_AFTER, RETIRED, Decision(S.DEAD, record=O.RETRY_AFTER)),
    (E.RETRY_AFTER, CLAIMED_RETIRED, Decision(S.DEAD, record=O.RETRY_AFTER)),
    (E.DISCARDED, LEFT, Decision(S.DEAD, record=O.DISCARDED)),
    (E.DISCARDED, SPENT, Decision(S.DEAD, record=O.DISCARDED)),
    (E.DISCARDED, CLAIMED_LEFT, Decision(S.DEAD, record=O.DISCARDED)),
    (E.DISCARDED, RETIRED, Decision(S.DEAD, record=O.DISCARDED)),
    (E.CANCELLED, LEFT, Decision(S.CANCELLED, record=O.CANCELLED)),
    (E.CANCELLED, SPENT, Decision(S.CANCELLED, record=O.CANCELLED)),
    (E.CANCELLED, CLAIMED_LEFT, Decision(S.CANCELLED, record=O.CANCELLED)),
    (E.CANCELLED, RETIRED, Decision(S.CANCELLED, record=O.CANCELLED)),
    # an operator's abort: a claim not started ran nothing (its attempt given back); a running one is
    # cancelled with an aborted attempt, whatever its attempts left or its owner
    (E.ABORT, CLAIMED_LEFT, Decision(S.CANCELLED, uncount=True)),
    (E.ABORT, CLAIMED_SPENT, Decision(S.CANCELLED, uncount=True)),
    (E.ABORT, CLAIMED_RETIRED, Decision(S.CANCELLED, uncount=True)),
    (E.ABORTED, LEFT, Decision(S.CANCELLED, record=O.ABORTED)),
    (E.ABORTED, SPENT, Decision(S.CANCELLED, record=O.ABORTED)),
    (E.ABORTED, RETIRED, Decision(S.CANCELLED, record=O.ABORTED)),
]


@pytest.mark.parametrize(("event", "facts", "expected"), CASES)
def test_each_event_decides_the_documented_next_state(event, facts, expected):
    """Every event, on a row in its state under its token, gives the documented decision."""
    assert lifecycle.decide(event, facts) == expected


@pytest.mark.parametrize("event", list(Event))
@pytest.mark.parametrize("state", list(JobState))
def test_an_event_changes_nothing_outside_its_state(event, state):
    """An event meets only rows in the state it applies to: any other state changes nothing."""
    decision = lifecycle.decide(event, Facts(state))
    if state in lifecycle.FROM_STATES[event]:
        assert decision is not None
    else:
        assert decision is None


@pytest.mark.parametrize("event", list(Event))
def test_a_stale_token_changes_nothing(event):
    """A claim taken back (the token no longer the row's) is refused whatever happened to it."""
    facts = Facts(lifecycle.FROM_STATES[event][0], token_matches=False, owner_deleted=True, together=True)
    assert lifecycle.decide(event, facts) is None


@pytest.mark.parametrize("event", list(Event))
@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("spent", [False, True])
def test_a_deleted_owners_job_never_returns_to_pending(event, together, spent):
    """The one deleted-owner rule: given back it is cancelled, a failure of its own is its last (dead)."""
    facts = Facts(
        lifecycle.FROM_STATES[event][-1],
        attempts=2 if spent else 1,
        max_attempts=2,
        owner_deleted=True,
        together=together,
    )
    decision = lifecycle.decide(event, facts)
    assert decision is not None
    assert decision.state != JobState.PENDING
    gave_back = event in lifecycle.GIVE_BACKS or (event == Event.CRASHED and together)
    if event in (Event.SUCCEEDED,):
        assert decision.state == JobState.DONE
    elif event in (Event.CANCEL, Event.CANCELLED, Event.ABORT, Event.ABORTED) or gave_back:
        assert decision.state == JobState.CANCELLED
    else:
        assert decision.state == JobState.DEAD


def test_a_plan_holds_the_decision_for_every_fact_the_row_may_have():
    """The transition statement's plan: one decision per (spent, owner deleted, run_alone), in BRANCHES order."""
    plan = lifecycle.plan(Event.FAILED)
    assert len(plan) == len(lifecycle.BRANCHES) == 8
    by_branch = dict(zip(lifecycle.BRANCHES, plan, strict=True))
    assert by_branch[(False, False, False)].state == JobState.PENDING
    assert by_branch[(True, False, False)].state == JobState.DEAD
    assert by_branch[(False, True, False)].state == JobState.DEAD
    shared = dict(zip(lifecycle.BRANCHES, lifecycle.plan(Event.CRASHED, together=True), strict=True))
    assert (shared[(True, False, False)].refund, shared[(True, False, False)].state) == (True, JobState.PENDING)
    assert (shared[(True, False, True)].refund, shared[(True, False, True)].state) == (False, JobState.DEAD)
    assert shared[(False, True, False)].state == JobState.CANCELLED


UNCOUNTED = [Event.UNSENT, Event.NOT_STARTED, Event.UNKNOWN_KIND, Event.RATE_LIMITED, Event.SNOOZED]


@pytest.mark.parametrize("event", UNCOUNTED)
def test_a_job_given_back_uncharged_beside_its_keys_waiting_job_is_refunded_not_uncounted(event):
    """Uncounted it would be its key's waiting job again and meet the successor in the key's index
    (a unique violation that lost its batch); refunded, it comes back as a retry, uncharged all the same."""
    facts = Facts(state=lifecycle.FROM_STATES[event][0])
    alone = lifecycle.decide(event, facts)
    beside = lifecycle.decide(event, Facts(state=facts.state, key_released=True))
    assert alone is not None
    assert beside is not None
    assert (alone.state, alone.uncount, alone.refund) == (JobState.PENDING, True, False)
    assert (beside.state, beside.uncount, beside.refund) == (JobState.PENDING, False, True)
    assert (beside.due, beside.record) == (alone.due, alone.record)
    deleted = lifecycle.decide(event, Facts(state=facts.state, key_released=True, owner_deleted=True))
    assert deleted is not None
    assert deleted.state == JobState.CANCELLED, "the deleted-owner rule first"


def test_the_statement_receives_the_plan_without_then_with_a_waiting_job_on_the_key():
    """lifecycle.plans: 16 decisions, the statement adds 8 to its index for a keyed row that started."""
    for event in Event:
        both = lifecycle.plans(event)
        assert both[:8] == lifecycle.plan(event)
        assert both[8:] == lifecycle.plan(event, key_released=True)
        changed = [i for i in range(8) if both[i] != both[8 + i]]
        assert all(both[i].uncount and both[8 + i].refund for i in changed), event
        assert bool(changed) == (event in UNCOUNTED), event


def test_a_plan_encodes_what_the_statement_reads():
    """The JSON a plan becomes names the state and each flag the statement applies."""
    encoded = lifecycle.encoded(lifecycle.plan(Event.FAILED))
    assert encoded[0] == {
        "state": "pending",
        "finished": False,
        "backoff": True,
        "record": "failed",
        "refund": False,
        "uncount": False,
        "run_alone": False,
        "keep_claim": False,
    }
    assert (encoded[4]["state"], encoded[4]["finished"], encoded[4]["backoff"]) == ("dead", True, False)


@pytest.mark.parametrize(
    ("state", "run_alone", "rows", "shared", "expected"),
    [
        (JobState.CLAIMED, False, 1, False, (Event.EXPIRED, False)),
        (JobState.RUNNING, False, 1, False, (Event.CRASHED, False)),
        (JobState.RUNNING, False, 3, False, (Event.CRASHED, True)),
        (JobState.RUNNING, False, 1, True, (Event.CRASHED, True)),
        (JobState.RUNNING, True, 3, False, (Event.CRASHED, False)),
    ],
)
def test_the_sweeper_names_the_event_of_an_expired_claim(state, run_alone, rows, shared, expected):
    """Never started: its message was lost; started: its process died, together when its batch still runs."""
    event, together, error = lifecycle.expired(state, run_alone, rows, shared)
    assert (event, together) == expected
    assert error.startswith("claim expired")


def test_one_backoff_doubles_up_to_its_cap_with_equal_jitter():
    """The only backoff: half the step fixed, half random, the step doubling from base to cap."""
    backoff = registry.Backoff(10.0, 60.0)
    rng = random.Random(7)
    for attempt, step in [(1, 10.0), (2, 20.0), (3, 40.0), (4, 60.0), (40, 60.0)]:
        delay = backoff.delay(attempt, rng)
        assert step / 2 <= delay <= step


@pytest.mark.parametrize("event", [Event.ABORT, Event.ABORTED])
def test_an_abort_never_retries_and_never_meets_a_finished_job(event):
    """An abort ends in cancelled for every branch of its plan, and a finished job is left as it is."""
    assert {d.state for d in lifecycle.plan(event)} == {JobState.CANCELLED}
    for state in (JobState.DONE, JobState.DEAD, JobState.CANCELLED, JobState.PENDING):
        assert lifecycle.decide(event, Facts(state)) is None
