"""Cancel, reschedule and claim racing on one row (threads on a barrier): one outcome wins, the API says which.

``tests/integration/due_at/test_claim.py`` races cancel against the claim; these race reschedule against
the claim, cancel against reschedule, and all three at once. Every change is a conditional UPDATE
on the row's state, so the row serialises them; the assertions check that the answers each caller
got describe one serial order, and that the row ended in the state that order produces.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from scheduling import api, exceptions
from scheduling.due_at import store
from scheduling.models import JobState, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

REPEATS = 8
FAR = dt.timedelta(hours=1)
tally: dict[str, Counter[str]] = {}  # which side won, per race, printed at the end of each test


def _due_job(run_sql) -> ScheduledJob:
    """A pending job already due by the database clock (scheduled far ahead, so no wake-up is sent)."""
    job = api.schedule("demo.noop", {}, delay=3600)
    support.make_due(job.id, ago="1 s")
    return ScheduledJob.objects.get(pk=job.id)


def _race(**actions: Callable[[], Any]) -> dict[str, tuple[str, Any]]:
    """Run the actions in threads released together; each answer is ("ok", value) or ("refused", state)."""
    barrier = threading.Barrier(len(actions))
    answers: dict[str, tuple[str, Any]] = {}

    def run(name: str, action: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            answers[name] = ("ok", action())
        except exceptions.JobStateConflict as exc:
            answers[name] = ("refused", exc.state)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=run, args=item) for item in actions.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert set(answers) == set(actions), f"an action did not finish: {answers}"
    return answers


def _claim() -> list[int]:
    return [c.id for c in store.claim_due_jobs(10)]


def _report(race: str, winner: str) -> None:
    tally.setdefault(race, Counter())[winner] += 1
    if sum(tally[race].values()) == REPEATS:
        print(f"\n[race] {race}: {dict(tally[race])}")


@pytest.mark.parametrize("repeat", range(REPEATS))
def test_reschedule_racing_a_claim_ends_in_exactly_one(run_sql, repeat):
    """Reschedule (to later) and claim racing on a due row: either it runs now or it moves, never both."""
    job = _due_job(run_sql)
    later = dt.datetime.now(dt.UTC) + FAR
    answers = _race(claim=_claim, reschedule=lambda: api.reschedule(job.id, due_at=later))
    stored = ScheduledJob.objects.get(pk=job.id)
    claimed = answers["claim"] == ("ok", [job.id])
    moved = answers["reschedule"][0] == "ok"
    assert claimed != moved, answers
    if claimed:
        assert answers["reschedule"] == ("refused", JobState.CLAIMED)
        assert (stored.state, stored.due_at, stored.attempts) == (JobState.CLAIMED, job.due_at, 1)
    else:
        assert answers["claim"] == ("ok", [])
        assert answers["reschedule"][1] == stored.due_at == later
        assert (stored.state, stored.attempts, stored.token) == (JobState.PENDING, 0, None)
    _report("reschedule vs claim", "claim" if claimed else "reschedule")


@pytest.mark.parametrize("repeat", range(REPEATS))
def test_cancel_racing_a_reschedule_ends_in_one_serial_order(run_sql, repeat):
    """Cancel and reschedule racing on a pending row: it ends cancelled; reschedule succeeds only if it came first."""
    job = api.schedule("demo.noop", {}, delay=3600)
    later = dt.datetime.now(dt.UTC) + 2 * FAR
    answers = _race(cancel=lambda: api.cancel(job.id), reschedule=lambda: api.reschedule(job.id, due_at=later))
    stored = ScheduledJob.objects.get(pk=job.id)
    assert answers["cancel"] == ("ok", job.id), "a reschedule leaves the job pending, so the cancel always lands"
    assert stored.state == JobState.CANCELLED
    if answers["reschedule"][0] == "ok":  # reschedule, then cancel
        assert answers["reschedule"][1] == stored.due_at == later
    else:  # cancel, then a reschedule that is told why not
        assert answers["reschedule"] == ("refused", JobState.CANCELLED)
        assert stored.due_at == job.due_at
    _report("cancel vs reschedule", "reschedule first" if answers["reschedule"][0] == "ok" else "cancel first")


@pytest.mark.parametrize("repeat", range(REPEATS))
def test_cancel_reschedule_and_claim_racing_agree_on_one_outcome(run_sql, repeat):
    """Claim, cancel and reschedule at once on a due row: claimed or cancelled, every refusal names that state."""
    job = _due_job(run_sql)
    later = dt.datetime.now(dt.UTC) + FAR
    answers = _race(
        claim=_claim, cancel=lambda: api.cancel(job.id), reschedule=lambda: api.reschedule(job.id, due_at=later)
    )
    stored = ScheduledJob.objects.get(pk=job.id)
    claimed = answers["claim"] == ("ok", [job.id])
    cancelled = answers["cancel"] == ("ok", job.id)
    assert claimed != cancelled, answers
    assert stored.state == (JobState.CLAIMED if claimed else JobState.CANCELLED)
    for name in ("cancel", "reschedule"):
        if answers[name][0] == "refused":
            assert answers[name][1] == stored.state, f"{name} was refused for the state the row ended in"
    if answers["reschedule"][0] == "ok":
        assert not claimed, "a row moved to later is not due: the claim cannot have taken it"
        assert stored.due_at == later
    else:
        assert stored.due_at == job.due_at
    winner = "claim" if claimed else "reschedule, then cancel" if answers["reschedule"][0] == "ok" else "cancel"
    _report("claim vs cancel vs reschedule", winner)
