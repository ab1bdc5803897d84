"""The registry of job kinds: backoff, validation and idempotency keys."""

from __future__ import annotations

import random

import pytest

from scheduling import exceptions, registry
from scheduling.core import registry as core_registry
from scheduling.core import validation


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
    broker = registry.Job(kind="k", payload={}, attempt=1, max_attempts=3, due_at=None, mechanism="deferrals", ref="7")
    assert first.idempotency_key == retry.idempotency_key == "job:7"
    assert broker.idempotency_key != first.idempotency_key
    assert broker.idempotency_key == "broker:7", "the deferrals' prefix predates the mechanism's name and stays"


def test_each_mechanism_is_named_for_the_package_that_owns_it():
    """registry.Mechanism's values are the names of scheduling's mechanism packages (due_at, deferrals, fixed)."""
    import importlib

    for mechanism in registry.Mechanism:
        package = importlib.import_module(f"scheduling.{mechanism.value}")
        assert package.__path__, f"scheduling.{mechanism.value} is not a package"


def test_handlers_are_found_in_each_installed_apps_jobs_module():
    """The demo's tasks/jobs.py is discovered like admin.py; Timekeeper's own scheduling.due_at (the engine) is not."""
    modules = registry.handler_modules()
    assert "tasks.jobs" in modules
    assert "scheduling.due_at" not in modules


def test_an_api_kind_whose_callers_could_hold_a_worker_too_long_is_refused_at_registration():
    """Access() with 5 attempts x 300 s (1,500 s) is over SCHEDULING_API_MAX_JOB_SECONDS (600 s): not registered."""
    with pytest.raises(exceptions.SchedulingError, match=r"5 attempts x 300 s = 1500 s, over SCHEDULING_API_MAX_JOB"):
        registry.handler("test.hog", timeout=300, max_attempts=5, api=registry.Access())(lambda job: None)
    with pytest.raises(exceptions.SchedulingError, match=r"20 attempts x 60 s"):
        registry.handler("test.hog", timeout=60, max_attempts=3, api=registry.Access(max_attempts=20))(lambda job: None)
    with pytest.raises(exceptions.UnknownJobKind):
        registry.get("test.hog")


@pytest.mark.parametrize(
    ("access", "says"),
    [
        (registry.Access(max_attempts=2), "at least the kind's max_attempts"),
        (registry.Access(max_attempts=True), "at least the kind's max_attempts"),
        (registry.Access(max_priority=10), "a priority from the kind's own"),
        (registry.Access(max_priority=-1), "a priority from the kind's own"),
    ],
)
def test_caller_bounds_below_the_kinds_own_or_out_of_range_are_refused(access, says):
    """A caller bound under what a caller who asks nothing gets, or not a priority, is a registration error."""
    with pytest.raises(exceptions.SchedulingError, match=says):
        registry.handler("test.bounds", timeout=10, max_attempts=3, api=access)(lambda job: None)
    with pytest.raises(exceptions.UnknownJobKind):
        registry.get("test.bounds")


def test_every_registered_api_kind_keeps_a_callers_worst_case_within_ten_minutes():
    """Each kind open to the API: its callers' most attempts x its timeout is at most 600 s; demo.record's sleep too."""
    open_kinds = {name: kind for name, kind in registry.all_kinds().items() if kind.api is not None}
    assert {"demo.noop", "demo.record", "reminders.trial_ending", "payments.retry"} <= set(open_kinds)
    for name, kind in open_kinds.items():
        assert kind.caller_max_attempts * kind.timeout_seconds <= 600, name
    record = registry.get("demo.record")
    assert record.schema is not None
    assert record.schema["properties"]["sleep"]["maximum"] <= record.timeout_seconds
    with pytest.raises(exceptions.InvalidPayload, match="sleep"):
        record.validate({"sleep": 3600})


def test_a_kinds_limits_are_its_own_else_the_settings(settings):
    """Kind.limits fills each limit the kind did not set from the settings, read when asked."""
    from scheduling import testing

    with testing.isolated_registry(keep_tasks=False):
        registry.handler("test.small", limits=registry.Limits(max_payload_bytes=100))(lambda job: None)
        registry.handler("test.plain")(lambda job: None)
        settings.SCHEDULING_MAX_PAYLOAD_BYTES = 5000
        settings.SCHEDULING_MAX_PAYLOAD_DEPTH = 7
        small, plain = registry.get("test.small").limits, registry.get("test.plain").limits
        assert (small.max_payload_bytes, small.max_payload_depth) == (100, 7)
        assert (plain.max_payload_bytes, plain.max_payload_depth) == (5000, 7)
        assert (registry.largest_limits().max_payload_bytes, registry.largest_limits().max_payload_depth) == (5000, 7)
        registry.handler("test.big", limits=registry.Limits(max_payload_bytes=9000))(lambda job: None)
        assert registry.largest_limits().max_payload_bytes == 9000


@pytest.mark.parametrize("limits", [registry.Limits(max_payload_bytes=0), registry.Limits(max_payload_depth=True)])
def test_limits_that_are_not_whole_numbers_above_zero_are_refused(limits):
    """A kind registered with a zero or boolean limit is a registration error, and is not registered."""
    with pytest.raises(exceptions.SchedulingError, match="must be a whole number above 0"):
        registry.handler("test.limits", limits=limits)(lambda job: None)
    with pytest.raises(exceptions.UnknownJobKind):
        registry.get("test.limits")


def test_handler_chosen_outcomes_carry_their_delay_and_reason():
    """Snooze and RetryAfter take seconds or a timedelta (not negative); Discard and Cancel keep the reason."""
    import datetime as dt

    assert registry.Snooze(dt.timedelta(minutes=1)).seconds == 60.0
    retry = registry.RetryAfter(30, "429 from the partner")
    assert (retry.seconds, retry.reason, retry.outcome) == (30.0, "429 from the partner", "retry_after")
    assert (registry.Discard("closed").reason, registry.Discard("closed").outcome) == ("closed", "discarded")
    assert registry.Cancel("gone").outcome == "cancelled"
    for bad in (-1, "soon", True):
        with pytest.raises(exceptions.SchedulingError):
            registry.Snooze(bad)


def test_max_snoozes_is_the_kinds_else_the_setting():
    """A kind's max_snoozes bounds its snoozes; unset, SCHEDULING_MAX_SNOOZES; a negative one is refused."""
    from django.test import override_settings

    registry.handler("tests.snoozes_own", max_snoozes=3)(lambda job: None)
    registry.handler("tests.snoozes_default")(lambda job: None)
    assert registry.get("tests.snoozes_own").max_snoozes == 3
    with override_settings(SCHEDULING_MAX_SNOOZES=7):
        assert registry.get("tests.snoozes_default").max_snoozes == 7
    with pytest.raises(exceptions.SchedulingError):
        registry.handler("tests.snoozes_bad", max_snoozes=-1)(lambda job: None)


def test_a_handlers_retry_or_snooze_is_at_most_ten_years_like_a_due_time():
    """A longer RetryAfter could not be stored again: a deferral's continuation row was refused and the job lost."""
    assert registry.RetryAfter(core_registry.MAX_DELAY_SECONDS).seconds == core_registry.MAX_DELAY_SECONDS
    for too_long in (core_registry.MAX_DELAY_SECONDS + 1, 5e8, float("inf")):
        with pytest.raises(exceptions.SchedulingError, match="ten years"):
            registry.RetryAfter(too_long)
        with pytest.raises(exceptions.SchedulingError, match="ten years"):
            registry.Snooze(too_long)
    assert validation.MAX_DELAY_SECONDS == core_registry.MAX_DELAY_SECONDS


def test_a_kind_that_is_no_string_is_unknown():
    for name in (None, ["a"], 3):
        with pytest.raises(exceptions.UnknownJobKind):
            registry.get(name)
