"""A job's options as one frozen value (``scheduling.core.options``): copied, checked against the kind, resolved."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from scheduling import exceptions, registry
from scheduling.core import options


def test_options_are_frozen_and_using_returns_a_changed_copy():
    """A JobOptions cannot change in place; ``using()`` gives a copy with the changes, the original intact."""
    base = options.JobOptions(delay=60, priority=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.priority = 5  # type: ignore[misc]
    changed = base.using(priority=5, key="k")
    assert (changed.priority, changed.key, changed.delay) == (5, "k", 60)
    assert (base.priority, base.key) == (3, None)


def test_validated_fills_the_kinds_defaults_and_resolves_every_option():
    """Unset attempts and priority come from the kind; a timedelta timeout and a backoff become seconds."""
    kind = registry.get("demo.record")
    valid = options.JobOptions(
        delay=dt.timedelta(minutes=1), owner=7, timeout=dt.timedelta(seconds=30), backoff=registry.Backoff(2, 8)
    ).validated(kind)
    assert (valid.delay_seconds, valid.due_at, valid.owner_id) == (60.0, None, 7)
    defaults = (kind.max_attempts, kind.priority, kind.lease_seconds)
    assert (valid.max_attempts, valid.priority, valid.lease_seconds) == defaults
    assert (valid.timeout_seconds, valid.backoff_base_seconds, valid.backoff_cap_seconds) == (30.0, 2.0, 8.0)
    assert valid.params()["delay"] == 60.0


@pytest.mark.parametrize(
    "bad",
    [
        {},  # neither due_at nor delay
        {"delay": 1, "on_conflict": "merge"},
        {"delay": 1, "key": ""},
        {"delay": 1, "max_attempts": 0},
        {"delay": 1, "timeout": -1},
        {"delay": 1, "atomic": "yes"},
        {"delay": 1, "unique_for": -1},
        {"delay": 1, "unique_for": 0.5},
        {"delay": 1, "unique_for": True},
        {"delay": 1, "unique_for": 60, "unique_states": ["done"]},
        {"delay": 1, "unique_for": 60, "unique_states": ["pending", "claimed", "running", "paused"]},
        {"delay": 1, "unique_for": 60, "unique_states": "pending"},
    ],
)
def test_validated_refuses_what_every_door_refuses(bad):
    """The doors' shared checks run in validated(): a bad option is InvalidSchedule before anything is stored."""
    with pytest.raises(exceptions.InvalidSchedule):
        options.JobOptions(**bad).validated(registry.get("demo.record"))


def test_standing_checks_a_recurrences_options_and_keeps_unset_ones_as_the_kinds():
    """standing() checks key, attempts and priority against the kind and keeps None (the kind's at each plan)."""
    kind = registry.get("demo.record")
    kept = options.JobOptions(key="digest:1", owner=7).standing(kind)
    assert kept == options.StandingOptions(key="digest:1", owner_id=7, max_attempts=None, priority=None)
    given = options.JobOptions(key="k", max_attempts=4, priority=9).standing(kind)
    assert (given.max_attempts, given.priority) == (4, 9)
    assert given.params() == {"key": "k", "owner_id": None, "max_attempts": 4, "priority": 9}


@pytest.mark.parametrize(
    "bad",
    [{"key": " "}, {"max_attempts": 0}, {"priority": 10}, {"delay": 5}, {"timeout": 3}, {"atomic": True}],
)
def test_standing_refuses_what_a_recurrence_cannot_take(bad):
    """A bad key, attempts or priority, or a time, timeout or atomicity of the occurrence's own, is refused."""
    with pytest.raises(exceptions.InvalidSchedule):
        options.JobOptions(**bad).standing(registry.get("demo.record"))


def test_a_uniqueness_window_resolves_to_seconds_and_ordered_states_with_the_kinds_default():
    """unique_for becomes seconds (0: none), unique_states a tuple in lifecycle order; unset, the kind's."""
    kind = registry.get("demo.record")
    valid = options.JobOptions(
        delay=1, unique_for=dt.timedelta(hours=1), unique_states=["done", "running", "claimed", "pending"]
    ).validated(kind)
    assert (valid.unique_for_seconds, valid.unique_states) == (3600.0, ("pending", "claimed", "running", "done"))
    assert options.JobOptions(delay=1, unique_for=0).validated(kind).unique_for_seconds is None
    default = options.JobOptions(delay=1).validated(dataclasses.replace(kind, unique_for_seconds=60.0))
    assert (default.unique_for_seconds, default.unique_states) == (60.0, options.DEFAULT_UNIQUE_STATES)
