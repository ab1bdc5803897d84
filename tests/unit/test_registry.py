"""The registry of job kinds: backoff, validation and idempotency keys."""

from __future__ import annotations

import random

import pytest

from scheduling import exceptions, registry


def test_backoff_grows_and_is_capped():
    """Each failed attempt doubles the step (with jitter in its upper half) up to the cap."""
    backoff = registry.Backoff(base_seconds=10, cap_seconds=100)
    rng = random.Random(1)
    for attempt, step in [(1, 10), (2, 20), (3, 40), (4, 80), (5, 100), (12, 100)]:
        for _ in range(50):
            delay = backoff.delay(attempt, rng)
            assert step / 2 <= delay <= step


def test_unknown_kind_is_a_named_error():
    """Looking up an unregistered kind raises UnknownJobKind naming it."""
    with pytest.raises(exceptions.UnknownJobKind, match=r"no\.such"):
        registry.get("no.such")


def test_schema_errors_say_where():
    """A payload failing the schema names the failing path."""
    kind = registry.get("reminders.trial_ending")
    with pytest.raises(exceptions.InvalidPayload, match="user_id"):
        kind.validate({"user_id": "one", "trial_id": 1})


def test_registering_a_kind_twice_is_refused():
    """Two handlers for one kind would make runs ambiguous."""
    with pytest.raises(exceptions.SchedulingError, match="twice"):

        @registry.handler("demo.noop")
        def other(job: registry.Job) -> None:
            """Another noop."""


@pytest.mark.parametrize("priority", [-1, 10, 2.5, "5", True])
def test_a_default_priority_outside_0_to_9_is_refused_at_registration(priority):
    """A kind's default priority is checked when it registers, not at every schedule() of the kind."""
    with pytest.raises(exceptions.SchedulingError, match="priority must be a whole number from 0 to 9"):
        registry.handler("test.bad_priority", priority=priority)(lambda job: None)
    with pytest.raises(exceptions.UnknownJobKind):
        registry.get("test.bad_priority")


def test_idempotency_key_is_per_job_not_per_attempt():
    """Retries of the same job share an idempotency key; different mechanisms do not collide."""
    first = registry.Job(kind="k", payload={}, attempt=1, max_attempts=3, due_at=None, id=7)
    retry = registry.Job(kind="k", payload={}, attempt=2, max_attempts=3, due_at=None, id=7)
    broker = registry.Job(kind="k", payload={}, attempt=1, max_attempts=3, due_at=None, mechanism="broker", ref="7")
    assert first.idempotency_key == retry.idempotency_key == "job:7"
    assert broker.idempotency_key != first.idempotency_key


def test_handlers_are_found_in_each_installed_apps_jobs_module():
    """The demo's tasks/jobs.py is discovered like admin.py; Timekeeper's own scheduling.jobs (the engine) is not."""
    modules = registry.handler_modules()
    assert "tasks.jobs" in modules
    assert "scheduling.jobs" not in modules
