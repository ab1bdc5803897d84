"""``manage.py timekeeper``: every subcommand's happy path and bad input, and the old names as aliases."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from scheduling import api
from scheduling.due_at import store as jobs_store
from scheduling.management import aliases
from scheduling.management.commands import timekeeper
from scheduling.models import JobAbort, JobState, KindControl, Recurrence, ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> tuple[str, str]:
    """Call the command; return (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    call_command("timekeeper", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def jobs() -> dict[str, int]:
    """An overdue pending job, a future one with a key, a dead one and a done one."""
    overdue = api.schedule("demo.noop", {}, delay=0)
    future = api.schedule("demo.record", {}, delay=3600, key="order:7")
    dead = api.schedule("demo.noop", {"n": "dead"}, delay=3600)
    ScheduledJob.objects.filter(pk=dead.id).update(
        state=JobState.DEAD, finished_at=timezone.now(), attempts=5, last_error="boom"
    )
    done = api.schedule("demo.noop", {"n": "done"}, delay=3600)
    ScheduledJob.objects.filter(pk=done.id).update(state=JobState.DONE, finished_at=timezone.now())
    return {"overdue": overdue.id, "future": future.id, "dead": dead.id, "done": done.id}


def test_jobs_lists_with_each_filter(jobs):
    """--state, --kind, --key, --overdue and --limit narrow the JSON listing as named."""

    def ids(*args: str) -> list[int]:
        return [row["id"] for row in json.loads(run("jobs", "--json", *args)[0])]

    assert sorted(ids()) == sorted(jobs.values())
    assert ids("--state", "dead") == [jobs["dead"]]
    assert ids("--kind", "demo.record") == [jobs["future"]]
    assert ids("--key", "order:7") == [jobs["future"]]
    assert ids("--overdue") == [jobs["overdue"]]
    assert len(ids("--limit", "2")) == 2
    text = run("jobs", "--state", "dead")[0]
    assert "boom" in text
    assert "demo.noop" in text


def test_cancel_changes_pending_jobs_and_reports_the_others(jobs):
    """cancel touches only pending jobs; the done one and a missing id are reported, not changed."""
    out, err = run("cancel", str(jobs["overdue"]), str(jobs["done"]), "999999")
    assert f"Cancelled 1 job: {jobs['overdue']}." in out
    assert f"Not cancelled (done, not pending): {jobs['done']}." in err
    assert "No such job: 999999." in err
    assert ScheduledJob.objects.get(pk=jobs["overdue"]).state == JobState.CANCELLED
    assert ScheduledJob.objects.get(pk=jobs["done"]).state == JobState.DONE


def test_abort_cancels_a_claim_asks_a_running_job_and_reports_a_finished_one(jobs):
    """abort cancels a claim not started, asks a running job's worker (as cli:<user>), and reports the done one."""
    claimed = api.schedule("demo.noop", {}, delay=0)
    running = api.schedule("demo.noop", {"n": "running"}, delay=0)
    ScheduledJob.objects.filter(pk=jobs["overdue"]).update(due_at=timezone.now() + dt.timedelta(hours=1))
    claims = {c.id: c.token for c in jobs_store.claim_due_jobs(10)}
    jobs_store.start_jobs([(running.id, claims[running.id])], "worker-1")
    out, err = run("abort", str(claimed.id), str(running.id), str(jobs["done"]))
    assert f"Aborted 2 jobs: {claimed.id}, {running.id}." in out
    assert f"Not aborted (done, not claimed or running): {jobs['done']}." in err
    assert ScheduledJob.objects.get(pk=claimed.id).state == JobState.CANCELLED
    assert JobAbort.objects.get(job_id=running.id).requested_by.startswith("cli")
    with pytest.raises(CommandError, match="only claimed or running jobs can be"):
        run("abort", str(jobs["done"]))


def test_a_change_that_touches_nothing_is_an_error(jobs):
    """Retrying a job that is not dead changes nothing and fails with a message saying what can be retried."""
    with pytest.raises(CommandError, match="only dead jobs can be"):
        run("retry", str(jobs["future"]))


def test_retry_makes_a_dead_job_pending(jobs):
    """retry moves the dead job back to pending with fresh attempts."""
    out, _err = run("retry", str(jobs["dead"]))
    assert f"Retried 1 job: {jobs['dead']}." in out
    job = ScheduledJob.objects.get(pk=jobs["dead"])
    assert (job.state, job.attempts) == (JobState.PENDING, 0)


def test_reschedule_with_at_and_in(jobs):
    """--at sets the due time given; --in sets it that many seconds from now."""
    run("reschedule", str(jobs["future"]), "--at", "2031-01-31T09:00:00+00:00")
    assert ScheduledJob.objects.get(pk=jobs["future"]).due_at == dt.datetime(2031, 1, 31, 9, tzinfo=dt.UTC)
    before = timezone.now()
    run("reschedule", str(jobs["future"]), "--in", "600")
    due_at = ScheduledJob.objects.get(pk=jobs["future"]).due_at
    assert before + dt.timedelta(seconds=590) < due_at < before + dt.timedelta(seconds=3600)


@override_settings(TIME_ZONE="Europe/Lisbon")
@pytest.mark.parametrize("wall", ["2030-03-31T01:30:00", "2030-10-27T01:30:00"], ids=["skipped", "repeated"])
def test_reschedule_refuses_a_wall_time_the_clocks_skip_or_repeat(jobs, wall):
    """Without an offset --at is read in TIME_ZONE: 01:30 of Lisbon's spring and autumn changes is no single moment."""
    before = stored()
    with pytest.raises(CommandError, match="is not a single moment in Europe/Lisbon"):
        run("reschedule", str(jobs["future"]), "--at", wall)
    assert stored() == before
    run("reschedule", str(jobs["future"]), "--at", "2030-07-01T01:30:00")  # summer time: one moment
    assert ScheduledJob.objects.get(pk=jobs["future"]).due_at == dt.datetime(2030, 7, 1, 0, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["cancel", "abc"], "is not a job id"),
        (["cancel", "0"], "ids are positive"),
        (["cancel", "9999999999999999999"], "ids are at most 9223372036854775807"),  # 19 digits, past bigint
        (["recurrences", "pause", "9999999999999999999"], "is not a recurrence id"),
        (["recurrences", "list", "--limit", "0"], "--limit must be a positive whole number"),
        (["recurrences", "list", "--limit", "99999999999999999999"], "--limit must be a positive whole number"),
        (["jobs", "--limit", "99999999999999999999"], "is too large"),
        (["reschedule", "1", "--at", "tomorrow"], "is not an ISO 8601 time"),
        (["reschedule", "1", "--in", "-5"], "zero or more seconds"),
        (["reschedule", "1"], "one of the arguments --at --in is required"),
        (["jobs", "--state", "lost"], "invalid choice"),
        (["jobs", "--limit", "0"], "must be positive"),
        (["kinds", "cap", "demo.noop", "zero"], "whole number from 1 to 1000000"),
        (["kinds", "pause", "no.such"], "timekeeper kinds list"),
        (["schedules", "no-such-schedule"], "No fixed-time schedule is named no-such-schedule"),
        (["schedules", "--next", "99"], "--next must be from 0 to 20"),
        (["sync", "no-such-schedule"], "No schedule is declared with the name"),
        (["status", "--format=xml"], "unrecognized arguments"),
        (["probe", "bogus"], "invalid choice"),
        (["recurrences", "next", "abc"], "is not a recurrence id"),
        (["nonesuch"], "invalid choice"),
    ],
)
def test_bad_input_is_a_command_error_naming_the_problem(jobs, args, says):
    """Each malformed argument of each subcommand is refused with a message a person can act on; nothing changes."""
    before = stored()
    with pytest.raises(CommandError, match=says):
        run(*args)
    assert stored() == before


@pytest.mark.parametrize("args", [("jobs",), ("sync",)])
def test_a_missing_table_is_reported_as_such_with_migrate_not_as_an_unreachable_database(args):
    """A ProgrammingError (a table not created yet) names its class and suggests migrate, not "Cannot reach"."""
    table = ScheduledJob._meta.db_table if args == ("jobs",) else PeriodicTask._meta.db_table
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_away"')  # undone with the transaction
        with pytest.raises(CommandError) as caught, transaction.atomic():
            run(*args)
        transaction.set_rollback(True)
    said = str(caught.value)
    named = f"database {connection.settings_dict['NAME']!r} on "
    assert said.startswith(f"Database error (ProgrammingError) in the {named}")
    assert f'relation "{table}" does not exist' in said
    assert "run `manage.py migrate`" in said
    assert said.index(named) < said.index("migrate"), "the database is named before migrate is suggested"
    assert "DATABASE_URL" in said
    assert "Cannot reach" not in said
    assert "\n" not in said, "the first line only"


def test_an_integrity_error_names_its_class_and_first_line_without_migrate():
    """Any other database error says its class and first line, and neither "Cannot reach" nor migrate."""
    said = timekeeper.database_error_message(IntegrityError("duplicate key value\nDETAIL: Key (id)=(1) exists."))
    named = f"database {connection.settings_dict['NAME']!r}"
    assert said.startswith(f"Database error (IntegrityError) in the {named} on ")
    assert said.endswith(": duplicate key value")
    assert "migrate" not in said


def test_status_json_is_api_status(jobs):
    """status --json prints scheduling.api.status(); the text form shows the backlog line."""
    data = json.loads(run("status", "--json")[0])
    assert (data["backlog"], data["pending"]) == (1, 2)
    assert "backlog (pending and due)" in run("status")[0]


def test_status_names_the_database_it_reads_first_without_its_password(jobs):
    """The text form's first line is the database's name, host and user (never a password); --json is unchanged."""
    settings = connection.settings_dict
    first = run("status")[0].splitlines()[0]
    assert first.startswith(f"database {settings['NAME']!r} on ")
    if settings.get("USER"):
        assert first.endswith(f" as {settings['USER']}")
    if settings.get("PASSWORD"):
        assert settings["PASSWORD"] not in first
    assert "database" not in json.loads(run("status", "--json")[0])


def stored() -> tuple[list[tuple[object, ...]], ...]:
    """What the commands could change: jobs, kind controls, periodic tasks, recurrences."""
    return (
        list(ScheduledJob.objects.order_by("id").values_list("id", "state", "due_at", "attempts")),
        list(KindControl.objects.order_by("kind").values_list("kind", "paused", "max_running")),
        list(PeriodicTask.objects.order_by("id").values_list("id", "name", "enabled")),
        list(Recurrence.objects.order_by("id").values_list("id", "state")),
    )


def test_kinds_pauses_caps_and_lists():
    """kinds pause and cap change the kind's control row; kinds list --json shows them."""
    run("kinds", "pause", "demo.noop")
    run("kinds", "cap", "demo.noop", "3")
    assert KindControl.objects.values_list("paused", "max_running").get(kind="demo.noop") == (True, 3)
    listed = {k["kind"]: k for k in json.loads(run("kinds", "list", "--json")[0])}
    assert (listed["demo.noop"]["paused"], listed["demo.noop"]["max_running"]) == (True, 3)


def test_sync_then_schedules_lists_what_was_written():
    """sync writes the declared examples; schedules lists them with their timing and next run, in JSON and text."""
    assert "created: " in run("sync")[0]
    assert "unchanged: " in run("sync")[0]
    listed = {row["name"]: row for row in json.loads(run("schedules", "--json", "--next", "2")[0])}
    settlement = listed["nightly-settlement"]
    assert (settlement["kind"], settlement["enabled"]) == ("reports.settlement", True)
    assert len(settlement["next_runs"]) == 2
    assert settlement["next_runs"][0].endswith(("+00:00", "+01:00"))  # Lisbon's wall clock
    only = json.loads(run("schedules", "nightly-settlement", "--json", "--next", "0")[0])
    assert [(row["name"], row["next_runs"]) for row in only] == [("nightly-settlement", [])]
    text = run("schedules")[0]
    assert text.splitlines()[0].split()[:3] == ["name", "kind", "enabled"]
    assert "nightly-settlement" in text


def test_schedules_says_so_when_there_are_none():
    """With no fixed-time schedule in the database, schedules says how to write them."""
    assert not PeriodicTask.objects.filter(policy__isnull=False).exists()
    assert "timekeeper sync" in run("schedules")[0]


def test_every_subcommand_and_argument_has_help():
    """Each subcommand, nested verb and argument of `timekeeper` carries help text."""
    parser = timekeeper.Command().create_parser("manage.py", "timekeeper")
    missing: list[str] = []
    seen = 0

    def walk(node: argparse.ArgumentParser, path: str) -> None:
        nonlocal seen
        for action in node._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for name, child in action.choices.items():
                    seen += 1
                    if not helps.get(name):
                        missing.append(f"{path} {name}")
                    walk(child, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {action.dest}")

    walk(parser, "timekeeper")
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(top.choices) == list(timekeeper.SUBCOMMANDS), "--help lists them in the declared order"
    assert seen >= 10 + 4 + 6  # the subcommands, kinds' verbs and recurrences' verbs
    assert missing == []


ALIAS_CALLS = [
    ("scheduling_status", ["--json"]),
    ("sync_schedules", []),
    ("timekeeper_kinds", ["list", "--json"]),
]


def same(data: object) -> object:
    """A listing without the readings that move with the clock (status's oldest overdue age)."""
    return {k: v for k, v in data.items() if k != "oldest_overdue_seconds"} if isinstance(data, dict) else data


@pytest.mark.parametrize(("old", "args"), ALIAS_CALLS)
def test_an_old_name_says_it_is_an_alias_and_does_the_same(jobs, old, args):
    """Each old command prints one deprecation line naming the new form on stderr, and the new form's output."""
    assert "timekeeper status" in aliases.deprecation("scheduling_status")
    run("sync")  # so sync's output is the steady one either way
    new_out, new_err = run(aliases.ALIASES[old], *args)
    out, err = io.StringIO(), io.StringIO()
    call_command(old, *args, stdout=out, stderr=err)
    assert err.getvalue().splitlines() == [aliases.deprecation(old)]
    assert f"manage.py timekeeper {aliases.ALIASES[old]}" in err.getvalue()
    assert new_err == ""
    if "--json" in args:
        assert same(json.loads(out.getvalue())) == same(json.loads(new_out))
    else:
        assert out.getvalue() == new_out


@pytest.mark.parametrize(
    ("old", "args", "says"),
    [
        ("scheduling_status", ["--format=xml"], "unrecognized arguments"),
        ("sync_schedules", ["no-such-schedule"], "No schedule is declared with the name"),
        ("timekeeper_kinds", ["cap", "demo.noop", "-1"], "whole number"),
    ],
)
def test_an_old_name_refuses_bad_input_as_the_new_form_does(jobs, old, args, says):
    """An alias given bad input raises the subcommand's CommandError and changes nothing."""
    before = stored()
    with pytest.raises(CommandError, match=says):
        call_command(old, *args, stdout=io.StringIO(), stderr=io.StringIO())
    assert stored() == before
