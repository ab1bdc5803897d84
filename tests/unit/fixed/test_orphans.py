"""The orphan duty's decision: which running fixed-time runs lost their worker (no database)."""

from __future__ import annotations

import pytest

from scheduling.fixed import orphans, store


def run(policy: str, age: float, deadline: int | None = 10, kind: str = "tests.no_such_kind") -> store.RunToCheck:
    return store.RunToCheck(
        id=1,
        schedule_id=1,
        concurrency_policy=policy,
        kind=kind,
        active_deadline_seconds=deadline,
        successful_history_limit=10,
        failed_history_limit=10,
        age_seconds=age,
    )


@pytest.mark.parametrize(
    ("policy", "age", "deadline", "lock_held", "closed_because"),
    [
        ("allow", 5, 10, None, None),  # young: may be running
        ("allow", 39, 10, None, None),  # within deadline + lease (10 + 30)
        ("allow", 41, 10, None, "no outcome 40s"),  # a lease past its deadline
        ("forbid", 1, 10, True, None),  # its lock is held: alive
        ("forbid", 1, 10, False, "overlap lock is free"),  # lock free: its process is gone
        ("replace", 1, 10, False, "overlap lock is free"),
        ("forbid", 41, 10, True, None),  # past its deadline but holding the lock: alive (only it can hold it)
        ("allow", 329, None, None, None),  # no active deadline: the kind's timeout (default 300 s)
        ("allow", 331, None, None, "no outcome 330s"),
    ],
)
def test_decide_closes_runs_whose_worker_is_gone(policy, age, deadline, lock_held, closed_because):
    """A run is closed when its overlap lock is free, or a lease past its deadline; otherwise left running."""
    error = orphans.decide(run(policy, age, deadline), lock_held, grace_seconds=30)
    if closed_because is None:
        assert error is None
    else:
        assert error is not None
        assert closed_because in error
