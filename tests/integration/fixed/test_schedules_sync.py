"""Declaring schedules in code, syncing them into django-celery-beat's tables, and the admin's helpers."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
from collections.abc import Iterator
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask, PeriodicTasks

from scheduling import exceptions, schedules
from scheduling.fixed import declarations, policies
from scheduling.models import SchedulePolicy

pytestmark = pytest.mark.django_db(transaction=True)

LISBON = ZoneInfo("Europe/Lisbon")


@pytest.fixture
def extra_declaration() -> Iterator[dict[str, schedules.Declaration]]:
    """Put declarations beside the ones in tasks/ for one test (what a bad deploy would carry)."""
    added: dict[str, schedules.Declaration] = {}
    schedules.declared()  # import tasks/ first
    yield added
    for name in added:
        declarations._declared.pop(name, None)


def add(registry: dict[str, schedules.Declaration], declaration: schedules.Declaration) -> None:
    registry[declaration.name] = declaration
    declarations._declared[declaration.name] = declaration


def test_sync_writes_crontab_with_zone_task_and_policy():
    """A cron declaration becomes a crontab in its zone, a run_fixed periodic task and a policy."""
    declaration = schedules.make(
        name="settle", kind="demo.noop", cron="@daily", timezone="Europe/Lisbon", concurrency_policy="replace",
        active_deadline_seconds=600, backoff_limit=2, payload={"a": 1},
    )  # fmt: skip
    report = schedules.sync(declarations=[declaration])
    assert report.created == ["settle"]
    task = PeriodicTask.objects.select_related("crontab", "policy").get(name="settle")
    assert task.task == "scheduling.run_fixed"
    assert json.loads(task.kwargs) == {"schedule": "settle"}
    assert (task.crontab.minute, task.crontab.hour, task.crontab.day_of_week) == ("0", "0", "*")
    assert str(task.crontab.timezone) == "Europe/Lisbon"
    assert task.interval is None
    policy = task.policy
    assert (policy.kind, policy.expression, policy.concurrency_policy) == ("demo.noop", "@daily", "replace")
    assert (policy.active_deadline_seconds, policy.backoff_limit, policy.payload) == (600, 2, {"a": 1})
    assert policy.timing_key == "cron 0 0 * * * Europe/Lisbon shift"
    assert policies.describe(task).startswith("@daily: ")


def test_sync_is_idempotent():
    """A second sync of the same declarations writes nothing: no change signal, the anchor stays."""
    declarations = [
        schedules.make(name="a", kind="demo.noop", cron="0 3 * * *", timezone="Europe/Lisbon"),
        schedules.make(name="b", kind="demo.noop", every=30),
    ]
    assert sorted(schedules.sync(declarations=declarations).created) == ["a", "b"]
    anchors = dict(SchedulePolicy.objects.values_list("periodic_task__name", "anchor_at"))
    changed = PeriodicTasks.last_change()
    counts = (PeriodicTask.objects.count(), CrontabSchedule.objects.count(), IntervalSchedule.objects.count())
    report = schedules.sync(declarations=declarations)
    assert report.unchanged == ["a", "b"]
    assert report.created == report.updated == []
    assert PeriodicTasks.last_change() == changed
    assert dict(SchedulePolicy.objects.values_list("periodic_task__name", "anchor_at")) == anchors
    assert (PeriodicTask.objects.count(), CrontabSchedule.objects.count(), IntervalSchedule.objects.count()) == counts


def test_changing_a_declaration_updates_it_and_moves_the_anchor_only_for_timing():
    """A new expression moves the anchor; a new history limit does not; the operator's suspend stays."""
    first = schedules.make(name="c", kind="demo.noop", cron="0 3 * * *", timezone="Europe/Lisbon")
    schedules.sync(declarations=[first])
    SchedulePolicy.objects.filter(periodic_task__name="c").update(suspend=True)
    policies.note_timing_change(SchedulePolicy.objects.get(periodic_task__name="c"))
    anchor = SchedulePolicy.objects.get(periodic_task__name="c").anchor_at
    limits = dataclasses.replace(first, successful_history_limit=9)
    assert schedules.sync(declarations=[limits]).updated == ["c"]
    kept = SchedulePolicy.objects.get(periodic_task__name="c")
    assert (kept.anchor_at, kept.successful_history_limit, kept.suspend) == (anchor, 9, True)
    timing = schedules.make(name="c", kind="demo.noop", cron="0 4 * * *", timezone="Europe/Lisbon")
    assert schedules.sync(declarations=[timing]).updated == ["c"]
    moved = SchedulePolicy.objects.get(periodic_task__name="c")
    assert moved.anchor_at > anchor
    assert moved.timing_key.startswith("cron 0 4 * * * Europe/Lisbon")
    assert moved.suspend


def test_sync_command_syncs_the_examples_twice_the_same():
    """timekeeper sync creates the examples in tasks/ (Lisbon settlement, forbid, replace), then finds them in sync."""
    out = io.StringIO()
    call_command("timekeeper", "sync", stdout=out)
    assert "created: " in out.getvalue()
    settlement = SchedulePolicy.objects.select_related("periodic_task__crontab").get(
        periodic_task__name="nightly-settlement"
    )
    assert str(settlement.periodic_task.crontab.timezone) == "Europe/Lisbon"
    assert (settlement.concurrency_policy, settlement.active_deadline_seconds) == ("forbid", 3000)
    assert SchedulePolicy.objects.get(periodic_task__name="metrics-aggregation").concurrency_policy == "forbid"
    assert SchedulePolicy.objects.get(periodic_task__name="cache-rebuild").concurrency_policy == "replace"
    again = io.StringIO()
    call_command("timekeeper", "sync", stdout=again)
    assert "created" not in again.getvalue()
    assert "updated" not in again.getvalue()
    assert "unchanged: " in again.getvalue()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "61 * * * *"}, "61 is out of range"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus_Mons"}, "no time zone 'Mars/Olympus_Mons'"),
        ({"kind": "reports.nope"}, "Unknown job kind 'reports.nope'"),
        ({"active_deadline_seconds": 90_000}, "must be shorter than the schedule's shortest interval"),
        ({"payload": {"blob": "x" * 70_000}}, "the limit is 65536 bytes"),
        ({"payload": json.loads("[" * 40 + "]" * 40)}, "nested deeper than 32 levels"),
    ],
)
def test_sync_command_refuses_an_invalid_declaration(extra_declaration, fields, message):
    """An invalid expression, zone, kind, timeout or payload (over the kind's size or depth limit) stops the command
    with a CommandError that says which."""
    base = {
        "name": "broken", "kind": "demo.noop", "cron": "0 3 * * *", "every": None, "timezone": "UTC",
        "concurrency_policy": "forbid", "starting_deadline_seconds": None, "active_deadline_seconds": None,
        "backoff_limit": 0, "successful_history_limit": 3, "failed_history_limit": 1, "missed_policy": "skip",
        "missed_window_seconds": 3600, "dst_gap": "shift", "payload": {}, "description": "",
    }  # fmt: skip
    add(extra_declaration, schedules.Declaration(**{**base, **fields}))
    with pytest.raises(CommandError, match=message):
        call_command("timekeeper", "sync", stdout=io.StringIO())
    assert not PeriodicTask.objects.filter(name="broken").exists(), "nothing is written"


def test_sync_command_refuses_an_unknown_name():
    """Naming a schedule nobody declared is a CommandError."""
    with pytest.raises(CommandError, match="No schedule is declared with the name"):
        call_command("timekeeper", "sync", "no-such-schedule", stdout=io.StringIO())


def test_validate_policy_refuses_a_timeout_not_shorter_than_the_interval():
    """The admin's check: a 60 s timeout on an every-60-s schedule is refused and attached to its field."""
    schedules.sync(declarations=[schedules.make(name="v", kind="demo.noop", every=60)])
    policy = SchedulePolicy.objects.select_related("periodic_task__interval").get(periodic_task__name="v")
    policies.validate_policy(policy)
    policy.active_deadline_seconds = 60
    with pytest.raises(exceptions.InvalidPolicy) as caught:
        policies.validate_policy(policy)
    assert caught.value.field == "active_deadline_seconds"  # type: ignore[attr-defined]
    policy.active_deadline_seconds = 30
    policy.kind = "nope"
    with pytest.raises(exceptions.UnknownJobKind):
        policies.validate_policy(policy)


def test_validate_policy_on_an_unsaved_edit_with_a_bad_crontab():
    """An unsaved periodic task whose crontab cannot be parsed is refused before anything is saved."""
    task = PeriodicTask(name="unsaved", task="scheduling.run_fixed", crontab=CrontabSchedule(minute="61", hour="3"))
    policy = SchedulePolicy(kind="demo.noop")
    with pytest.raises(exceptions.InvalidCronExpression):
        policies.validate_policy(policy, task)


def test_validate_policy_refuses_a_crontab_row_celery_cannot_read():
    """An admin crontab with day of week 1-7 is refused, naming the spelling Celery reads (beat would drop it)."""
    task = PeriodicTask(
        name="sundays", task="scheduling.run_fixed", crontab=CrontabSchedule(minute="0", hour="3", day_of_week="1-7")
    )
    with pytest.raises(exceptions.InvalidCronExpression, match="write it as '0-6'"):
        policies.validate_policy(SchedulePolicy(kind="demo.noop"), task)
    task.crontab.day_of_week = "0-6"
    policies.validate_policy(SchedulePolicy(kind="demo.noop"), task)


def test_preview_lists_the_next_runs_in_the_schedules_zone():
    """preview() gives the next five runs of the Lisbon settlement at 03:00 local, across the spring change."""
    declaration = schedules.make(name="p", kind="demo.noop", cron="0 3 * * *", timezone="Europe/Lisbon")
    schedules.sync(declarations=[declaration])
    task = PeriodicTask.objects.get(name="p")
    runs = policies.preview(task, n=5, after=dt.datetime(2026, 3, 27, 12, tzinfo=dt.UTC))
    assert [r.isoformat() for r in runs] == [
        "2026-03-28T03:00:00+00:00",
        "2026-03-29T03:00:00+01:00",
        "2026-03-30T03:00:00+01:00",
        "2026-03-31T03:00:00+01:00",
        "2026-04-01T03:00:00+01:00",
    ]
    assert all(r.tzinfo == LISBON for r in runs)
    assert policies.describe(task) == "At 03:00 AM (Europe/Lisbon)"
    SchedulePolicy.objects.filter(periodic_task=task).update(suspend=True)
    assert policies.preview(SchedulePolicy.objects.get(periodic_task=task)) == []


@pytest.mark.parametrize(
    ("fields", "error", "says"),
    [
        ({"backoff_limit": -1}, exceptions.InvalidPolicy, "backoff_limit must be a whole number from 0 to 32767"),
        ({"backoff_limit": 100_000}, exceptions.InvalidPolicy, "backoff_limit must be a whole number"),
        ({"successful_history_limit": -1}, exceptions.InvalidPolicy, "successful_history_limit"),
        ({"failed_history_limit": 10**9}, exceptions.InvalidPolicy, "failed_history_limit"),
        ({"missed_window_seconds": -1}, exceptions.InvalidPolicy, "missed_window_seconds"),
        ({"active_deadline_seconds": 1.5, "every": 3600}, exceptions.InvalidPolicy, "active_deadline_seconds"),
        ({"dst_gap": "bogus"}, exceptions.InvalidPolicy, "Unknown DST gap policy"),
        ({"kind": None}, exceptions.InvalidPolicy, "kind must be a kind's name"),
        ({"payload": [1, 2]}, exceptions.InvalidPayload, "must be a JSON object"),
        ({"payload": "x"}, exceptions.InvalidPayload, "must be a JSON object"),
        (
            {"every": None, "cron": "0 3 * * " + ",".join(["mon"] * 40)},  # the parser takes 200, the column 100
            exceptions.InvalidCronExpression,
            "longer than 100 characters",
        ),
    ],
)
def test_a_policy_its_row_cannot_hold_is_a_named_error_and_nothing_is_written(fields, error, says):
    """Each was a database error at the sync (a smallint out of range, a varchar(100)), a TypeError in make(),
    or stored as given (a float timeout that made every later sync report 'updated')."""
    before = list(SchedulePolicy.objects.values_list("id", "periodic_task__name"))
    with pytest.raises(error, match=says):
        schedules.sync(declarations=[schedules.make(**{"name": "bad", "kind": "demo.noop", "every": 60, **fields})])
    assert list(SchedulePolicy.objects.values_list("id", "periodic_task__name")) == before


def test_whole_numbers_written_as_floats_still_sync():
    """60.0 for a timeout or a window was stored as 60 before the range checks: it still is, and syncs unchanged."""
    made = schedules.make(name="floats", kind="demo.noop", every=3600, active_deadline_seconds=60.0,
                          missed_window_seconds=3600.0)  # fmt: skip
    schedules.sync(declarations=[made])
    stored = SchedulePolicy.objects.get(periodic_task__name="floats")
    assert (stored.active_deadline_seconds, stored.missed_window_seconds) == (60, 3600)
