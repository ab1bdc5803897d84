"""Advisory locks on their own connections, and the pg_locks read the store makes for them."""

from __future__ import annotations

import itertools

import pytest

from scheduling.core import locks

pytestmark = pytest.mark.django_db


def _name_with_key(negative: bool) -> str:
    return next(f"n{i}" for i in itertools.count() if (locks.lock_key("test", f"n{i}") < 0) == negative)


@pytest.mark.parametrize("negative", [False, True], ids=["positive-key", "negative-key"])
def test_is_locked_sees_a_lock_held_on_another_connection_until_it_is_released(negative):
    """is_locked reads pg_locks for the 64-bit key (either sign): true while held elsewhere, false after."""
    name = _name_with_key(negative)
    lock = locks.AdvisoryLock("test", name)
    assert not locks.is_locked("test", name)
    with lock:
        assert locks.is_locked("test", name)
        assert not locks.is_locked("test", name + "-other")
    assert not locks.is_locked("test", name)
