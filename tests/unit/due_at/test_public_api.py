"""The public facade ``scheduling.api``: its names, each listed once in the module that defines it."""

from __future__ import annotations

from scheduling import api
from scheduling.due_at import api as jobs_api
from scheduling.recurring import api as recurring_api

EXPECTED = [
    "Aborted",
    "BulkResult",
    "Deferral",
    "NewEntry",
    "abort",
    "abort_many",
    "abort_schedule_run",
    "cancel",
    "cancel_many",
    "cancel_recurrence",
    "cancel_recurrences",
    "change_recurrence",
    "defer",
    "get_recurrence",
    "kind_controls",
    "kind_overview",
    "next_occurrences",
    "pause",
    "pause_recurrence",
    "pause_recurrences",
    "queue_status",
    "recur",
    "recur_many",
    "reschedule",
    "reschedule_many",
    "resume",
    "resume_recurrence",
    "resume_recurrences",
    "retire_owner",
    "retry_dead_many",
    "run_now_many",
    "schedule",
    "schedule_many",
    "schedule_with_outcome",
    "set_max_running",
    "set_rate",
    "status",
]


def test_public_names_are_unchanged():
    """scheduling.api.__all__ is exactly the names it had when each was written three times, retire_owner and abort."""
    assert api.__all__ == EXPECTED


def test_star_import_gives_every_public_name():
    """``from scheduling.api import *`` binds every public name, and nothing private."""
    namespace: dict[str, object] = {}
    exec("from scheduling.api import *", namespace)  # noqa: S102 -- the statement under test
    assert sorted(name for name in namespace if name != "__builtins__") == EXPECTED


def test_names_come_from_their_defining_module():
    """Each re-exported name is the mechanism's own object; status and defer are the facade's."""
    for name in jobs_api.__all__:
        assert getattr(api, name) is getattr(jobs_api, name), name
    for name in recurring_api.__all__:
        assert getattr(api, name) is getattr(recurring_api, name), name
    assert "status" not in jobs_api.__all__
    assert api.status is not jobs_api.status  # the facade's adds the broker's counts
    assert api.BulkResult is jobs_api.BulkResult  # the jobs' bulk result, not the recurrences' own
