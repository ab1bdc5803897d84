"""Fixed-time schedules end to end: real beat replicas and workers on short interval schedules."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import os
import signal
import time
import zoneinfo

import pytest
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask

from scheduling import schedules
from scheduling.core import store
from scheduling.fixed import cron, declarations, gate
from scheduling.models import RunState, SchedulePolicy, ScheduleRun
from tests.e2e import fixed_soak
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]


def declare(name: str, **fields: object) -> SchedulePolicy:
    fields.setdefault("kind", "demo.record")
    fields.setdefault("successful_history_limit", 1000)
    fields.setdefault("failed_history_limit", 1000)
    schedules.sync(declarations=[schedules.make(name=name, **fields)])  # type: ignore[arg-type]
    return SchedulePolicy.objects.get(periodic_task__name=name)


def runs(name: str, state: str | None = None) -> list[ScheduleRun]:
    found = ScheduleRun.objects.filter(schedule__periodic_task__name=name).order_by("tick")
    return list(found.filter(state=state) if state else found)


def seconds(run: ScheduleRun) -> float:
    assert run.finished_at is not None
    return (run.finished_at - run.started_at).total_seconds()


@pytest.mark.slow
def test_two_beats_three_workers_leader_killed_three_times_one_run_per_tick_none_missed(cluster):
    """Every 2 s for 48 s, two beats, three workers, the leader kill -9ed 3 times: each tick runs once, none missed."""
    # missed_policy skip (the default): a tick beat did not send would be recorded missed, not caught up.
    # The 2nd and 3rd takeovers are slowed (standbys stopped 4.5 s, 3 s, as on a loaded host), so the
    # next leader finds two or three ticks come due since the last one sent, all within the late tolerance.
    report = fixed_soak.soak(
        cluster, seconds=48, every=2, workers=3, kill_leader_after=10, kills=3, kill_every=12,
        standby_pauses=(0.0, 4.5, 3.0), missed_policy="skip",
    )  # fmt: skip
    print(f"\nfixed-time soak: {report.summary()}")
    assert report.problems == []
    assert report.missed == 0
    assert report.missed_warnings == 0, "no beat gave up on a tick (an injected duplicate may have run it)"
    assert len(report.handovers) == 3, "the standby took the lead after each kill"
    assert report.ticks_checked >= 20
    assert report.injected >= 5
    assert report.injected_refused_ticks == report.injected, "beat sent every injected tick too; one was refused"
    assert report.duplicates_refused >= report.injected
    assert report.first_run_after_kill_seconds is not None


def test_forbid_skips_replace_stops_and_the_timeout_stops(cluster):
    """forbid skips ticks while a 7 s run goes, replace stops the old 30 s runs, a 2 s active deadline stops runs."""
    declare("forbid-3s", every=3, payload={"sleep": 7}, concurrency_policy="forbid")
    declare("replace-4s", every=4, payload={"sleep": 30}, concurrency_policy="replace")
    declare("timeout-5s", every=5, payload={"sleep": 30}, active_deadline_seconds=2)
    worker = cluster.worker("w1", concurrency=4)
    cluster.beat("beat1")
    wait_ready(worker)
    wait_for(lambda: len(runs("replace-4s", RunState.REPLACED)) >= 2, 60, message="two replaced runs")
    wait_for(lambda: len(runs("forbid-3s", RunState.SUCCEEDED)) >= 2, 60, message="two forbid runs to finish")
    wait_for(lambda: len(runs("timeout-5s", RunState.TIMED_OUT)) >= 2, 60, message="two timed-out runs")

    skipped = runs("forbid-3s", RunState.SKIPPED)
    assert skipped, "ticks during a 7 s run of a 3 s schedule are skipped"
    assert all("still going" in run.error for run in skipped)
    done = runs("forbid-3s", RunState.SUCCEEDED)
    for earlier, later in itertools.pairwise(done):
        assert earlier.finished_at is not None
        assert later.started_at >= earlier.finished_at - dt.timedelta(seconds=0.5), "forbid runs never overlap"

    replaced = runs("replace-4s", RunState.REPLACED)
    for run in replaced:
        assert seconds(run) < 30, "a replaced run was stopped, not left to sleep its 30 s"
        assert run.error.startswith("stopped for the run of ")
    assert not runs("replace-4s", RunState.SUCCEEDED)

    for run in runs("timeout-5s", RunState.TIMED_OUT):
        assert run.error == "stopped after 2s (active deadline)"
        assert seconds(run) < 30, "stopped, not left to sleep its 30 s"


def test_kill_9_of_a_worker_mid_run_releases_the_lock_and_the_next_tick_runs(cluster):
    """SIGKILL of the worker running a tick frees the schedule's lock; the next tick runs on the other worker."""
    policy = declare("killed-3s", every=3, payload={"sleep": 10}, concurrency_policy="forbid")
    workers = [cluster.worker("w1"), cluster.worker("w2")]
    cluster.beat("beat1")
    for worker in workers:
        wait_ready(worker)
    running = wait_for(lambda: runs("killed-3s", RunState.RUNNING), 60, message="a run to start")[0]
    pid = int(running.worker.rsplit(":", 1)[1])
    victim = next(w for w in workers if pid in w.children())
    survivor = next(w for w in workers if w is not victim)
    assert gate.is_running(policy.pk)
    os.killpg(victim.pid, signal.SIGKILL)  # the worker and its pool processes, as kill -9 of the container would
    killed = time.monotonic()
    killed_at = store.database_now()
    wait_for(lambda: not gate.is_running(policy.pk), 15, message="the lock to be released")
    released = time.monotonic() - killed
    nxt = wait_for(
        lambda: [r for r in runs("killed-3s") if r.tick > running.tick and r.state in ("running", "succeeded")],
        30,
        message="a later tick to run",
    )[0]
    print(f"\nworker SIGKILL: lock released after {released:.2f}s; next run started "
          f"{(nxt.started_at - killed_at).total_seconds():.2f}s after the kill")  # fmt: skip
    assert int(nxt.worker.rsplit(":", 1)[1]) in survivor.children()
    assert nxt.started_at >= killed_at
    lost = ScheduleRun.objects.get(pk=running.pk)
    assert lost.state == RunState.FAILED
    assert "worker running it was lost" in lost.error


def test_day_seven_schedules_sync_as_crontabs_celery_reads_and_a_real_beat_fires_them(cluster):
    """0 3 * * 7 and 0 3 * * 1-7 sync (timekeeper sync) into crontabs Celery reads; a real beat keeps and fires both."""
    expressions = {"sundays-0300": ("0 3 * * 7", "0", {0}), "every-day-1-7": ("0 3 * * 1-7", "0-6", set(range(7)))}
    zone = _a_zone_where_0300_is_not_near(store.database_now())
    schedules.declared()  # import tasks/ first, so the test's own declarations are the only extra ones
    try:
        for name, (expression, _, _) in expressions.items():
            # run_once with an 8-day deadline: the latest tick (within the last week) is caught up when beat starts.
            schedules.declare(
                name=name, kind="demo.record", cron=expression, timezone=zone, missed_policy="run_once",
                starting_deadline_seconds=8 * 86_400, failed_history_limit=20,
            )  # fmt: skip
        call_command("timekeeper", "sync", *expressions, stdout=io.StringIO())
    finally:
        for name in expressions:
            declarations._declared.pop(name, None)
    now = store.database_now()
    latest: dict[str, dt.datetime] = {}
    for name, (expression, written, days) in expressions.items():
        task = PeriodicTask.objects.select_related("crontab").get(name=name)
        assert task.crontab.day_of_week == written
        assert task.crontab.schedule.day_of_week == days, "Celery's crontab reads the row (it raised ValueError on 7)"
        SchedulePolicy.objects.filter(periodic_task=task).update(anchor_at=now - dt.timedelta(days=8), last_tick=None)
        tick = cron.CronSchedule.parse(expression, zone).latest_at_or_before(now)
        assert tick is not None
        latest[name] = tick
    worker = cluster.worker("w1")
    beat = cluster.beat("beat1")
    wait_ready(worker)
    for name, tick in latest.items():
        run = wait_for(
            lambda name=name, tick=tick: [r for r in runs(name, RunState.SUCCEEDED) if r.tick == tick],
            90,
            message=f"{name}: its latest tick {tick.isoformat()} to run",
        )[0]
        assert run.trigger == "catch_up"
    assert "cannot be read by Celery" not in beat.log()


def _a_zone_where_0300_is_not_near(now: dt.datetime) -> str:
    """Europe/Lisbon, unless 03:00 there is within half an hour of now; then Asia/Tokyo (03:00 there is 18:00 UTC).

    A tick of the last minute is on time (trigger ``beat``, ``fixed_late_seconds``), not caught up:
    run at 03:00 Lisbon time, the test waited for a catch-up that beat rightly sent as on time.
    """
    for zone in ("Europe/Lisbon", "Asia/Tokyo"):
        local = now.astimezone(zoneinfo.ZoneInfo(zone))
        if abs(local.hour * 60 + local.minute - 3 * 60) > 30:
            return zone
    raise AssertionError("03:00 cannot be near now in both zones")


def test_a_zone_is_chosen_whose_0300_is_half_an_hour_away_or_more():
    lisbon_0300 = dt.datetime(2026, 12, 7, 3, 0, 26, tzinfo=dt.UTC)  # when CI ran it (Lisbon is UTC+0 in winter)
    assert _a_zone_where_0300_is_not_near(lisbon_0300) == "Asia/Tokyo"
    assert _a_zone_where_0300_is_not_near(lisbon_0300 - dt.timedelta(minutes=29)) == "Asia/Tokyo"
    assert _a_zone_where_0300_is_not_near(lisbon_0300 + dt.timedelta(hours=1)) == "Europe/Lisbon"
    assert _a_zone_where_0300_is_not_near(dt.datetime(2026, 7, 1, 2, 10, tzinfo=dt.UTC)) == "Asia/Tokyo"  # 03:10 WEST
    assert _a_zone_where_0300_is_not_near(dt.datetime(2026, 12, 7, 18, 0, tzinfo=dt.UTC)) == "Europe/Lisbon"


def test_a_beat_started_with_a_foreign_scheduler_says_so_at_its_start(cluster):
    """W002 cannot see beat's -S option; beat itself logs the problem as it starts (and not under ours)."""
    schedules.declared()  # the demo's declarations are what makes the scheduler matter
    foreign = cluster.beat("beat-foreign", args=["-S", "celery.beat:PersistentScheduler"])
    ours = cluster.beat("beat-ours")
    wait_for(lambda: "beat: Starting..." in foreign.log() and "beat: Starting..." in ours.log(), 60,
             message="both beats to start")  # fmt: skip
    wait_for(lambda: "scheduling.W002" in foreign.log(), 30, message="the foreign scheduler to be named")
    assert "this beat runs the scheduler 'celery.beat:PersistentScheduler'" in foreign.log()
    assert "scheduling.W002" not in ours.log()
