"""Helpers for testing your own jobs and tasks: run them inline, assert what was scheduled, isolate kinds.

In a test of your project (pytest-django or Django's ``TestCase``; PostgreSQL as always)::

    from scheduling import api, testing

    def test_signup_schedules_the_welcome(db):
        signup("ada@example.com")
        job = testing.assert_scheduled("billing.send_welcome", payload={"email": "ada@example.com"})
        report = testing.run_due(include_future=True)   # runs it here, in the test's process
        assert report.succeeded == 1

- ``run_due()`` claims the jobs that are due now (by the database's wall clock, even inside
  Django's ``TestCase``, whose transaction freezes ``now()``) and runs them in the test's process
  through the real runner: the same claim, retries, attempts and outcomes as a worker, Django
  tasks of ``scheduling.backends`` included. ``include_future=True`` first makes every pending job
  due now (``api.run_now_many``). It loops until nothing is due (a job that schedules another due
  job sees it run too), at most ``max_rounds`` times. No worker, no broker.
- ``assert_scheduled(kind, payload=..., key=..., due_at=..., state=...)``: exactly ``count``
  (default 1) jobs of ``kind`` match; the failure message lists the jobs of that kind there are.
- ``isolated_registry()``: a block with an empty registry of kinds (handlers declared inside it
  vanish after it), with the Django tasks already declared kept unless ``keep_tasks=False``.
- ``inline_deferrals()``: a block in which ``api.defer()`` stores every deferral as a due_at row
  (``mechanism == "due_at"``) instead of sending a Celery countdown, so ``run_due(include_future=True)``
  runs it inline; also as a decorator. Without it, a short deferral is a message to Redis that only
  a worker runs.

Heartbeats are off while ``run_due`` runs (there is no other process to take the claims back), and
``transaction.on_commit`` callbacks of the jobs run when the test's transaction commits: inside
Django's ``TestCase`` wrap the call in ``self.captureOnCommitCallbacks(execute=True)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.db.models import DateTimeField, Func
from django.test.utils import override_settings

from scheduling import api, backends
from scheduling.core import registry
from scheduling.due_at import claim, runner
from scheduling.models import JobState, ScheduledJob

ANY: Any = object()  # "any value" for assert_scheduled's filters
CLAIM_LIMIT = 500  # rows one round of run_due claims
DEFAULT_MAX_ROUNDS = 20  # rounds of claim-and-run before run_due stops (a job that keeps scheduling itself)


@dataclasses.dataclass
class RunReport:
    """What ``run_due()`` ran: the batch reports added up, and the ids of the jobs it claimed."""

    rounds: int = 0
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    job_ids: list[int] = dataclasses.field(default_factory=list)


def run_due(*, include_future: bool = False, max_rounds: int = DEFAULT_MAX_ROUNDS) -> RunReport:
    """Claim the due jobs and run them in this process, round after round until none is due."""
    report = RunReport()
    with override_settings(SCHEDULING_HEARTBEAT_SECONDS=0):
        for _ in range(max_rounds):
            if include_future:
                pending = list(ScheduledJob.objects.filter(state=JobState.PENDING).values_list("id", flat=True))
                if pending:
                    api.run_now_many(pending)
            else:
                _due_by_the_wall_clock()
            claims = claim.claim_here(CLAIM_LIMIT)
            if not claims:
                break
            report.rounds += 1
            report.job_ids.extend(c.id for c in claims)
            batch = runner.run_batch([(c.id, c.token) for c in claims])
            report.started += batch.started
            report.succeeded += batch.succeeded
            report.failed += batch.failed
    return report


def _due_by_the_wall_clock() -> None:
    """Make due, for the claim, the pending jobs whose due time has passed by the wall clock.

    The claim compares with ``now()``, which PostgreSQL freezes at the start of a transaction: inside
    Django's ``TestCase`` (one transaction per test), a task enqueued with ``run_after=timezone.now()``
    would never be due. ``clock_timestamp()`` is the wall clock; those jobs' due time becomes ``now()``.
    """
    wall_clock = Func(function="clock_timestamp", output_field=DateTimeField())
    transaction_start = Func(function="now", output_field=DateTimeField())  # Django's Now() is statement time
    late = ScheduledJob.objects.filter(state=JobState.PENDING, due_at__lte=wall_clock, due_at__gt=transaction_start)
    ids = list(late.values_list("id", flat=True))
    if ids:
        api.run_now_many(ids)


def assert_scheduled(
    kind: str,
    *,
    payload: Any = ANY,
    key: Any = ANY,
    due_at: Any = ANY,
    within: dt.timedelta = dt.timedelta(seconds=1),
    state: Any = JobState.PENDING,
    count: int = 1,
) -> ScheduledJob | None:
    """Assert that ``count`` jobs of ``kind`` match (``due_at`` within ``within``); returns the latest one.

    Filters left out (``ANY``) match everything; ``state=ANY`` takes every state.
    """
    jobs = list(ScheduledJob.objects.filter(kind=kind).order_by("id"))

    def matches(job: ScheduledJob) -> bool:
        return (
            (payload is ANY or job.payload == payload)
            and (key is ANY or job.key == key)
            and (state is ANY or job.state == state)
            and (due_at is ANY or abs(job.due_at - due_at) <= within)
        )

    found = [job for job in jobs if matches(job)]
    if len(found) != count:
        wanted = {
            name: value
            for name, value in (("payload", payload), ("key", key), ("due_at", due_at), ("state", state))
            if value is not ANY
        }
        seen = "\n".join(
            f"  #{j.id} state={j.state} key={j.key!r} due_at={j.due_at.isoformat()} payload={j.payload!r}" for j in jobs
        )
        raise AssertionError(
            f"expected {count} job(s) of {kind!r} matching {wanted}, found {len(found)}; "
            f"jobs of {kind!r}:\n{seen or '  (none)'}"
        )
    return found[-1] if found else None


@contextlib.contextmanager
def isolated_registry(*, keep_tasks: bool = True) -> Iterator[None]:
    """An empty registry of kinds inside the block; the previous one is back after it.

    ``keep_tasks``: the Django tasks declared so far keep their kinds (their modules are not
    imported again, so their decorators would not register them); ``False``: no task is known in
    the block, not even by its module path.
    """
    saved, loaded, finders = dict(registry._kinds), registry._loaded, list(registry._finders)
    registry._kinds.clear()
    registry._loaded = True  # the apps' jobs modules are not imported into it
    try:
        if keep_tasks:
            for declared in list(backends._tasks.values()):
                backends._register(declared)
        else:
            registry._finders.clear()  # nor are tasks found by their module path
        yield
    finally:
        registry._kinds.clear()
        registry._kinds.update(saved)
        registry._loaded = loaded
        registry._finders[:] = finders


def inline_deferrals() -> override_settings:
    """In this block (or decorated test), ``api.defer()`` stores rows that ``run_due(include_future=True)`` runs."""
    return override_settings(SCHEDULING_BROKER_DELAY_MAX_SECONDS=-1)


__all__ = ["ANY", "RunReport", "assert_scheduled", "inline_deferrals", "isolated_registry", "run_due"]
