"""Beat's fixed-time entries on real PostgreSQL and Redis, with a controlled clock.

The scheduler here is the real ``LeaderDatabaseScheduler`` built in-process (no ``celery beat``
process): entries are read from the database, ``is_due()`` runs ``ticks.plan()`` on the rows at
the injected clock, and ``apply_entry()`` sends real messages to this run's Redis queue.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django_celery_beat.models import CrontabSchedule, PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler

from project.celery import app as celery_app
from scheduling import schedules
from scheduling.core import leadership, store
from scheduling.fixed import beat, cron, edits, messages
from scheduling.models import SchedulePolicy, SchedulerHeartbeat, ScheduleRun

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.UTC


class FakeClock:
    """A clock the test sets; what beat's fixed-time entries read as the database clock."""

    def __init__(self, now: dt.datetime) -> None:
        self.at = now

    def now(self) -> dt.datetime:
        return self.at


@pytest.fixture
def queue() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Drain this run's default Redis queue: the kwargs of every message sent since the last call."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    key = settings.CELERY_BROKER_KEYPREFIX + settings.CELERY_TASK_DEFAULT_QUEUE
    client.delete(key)

    def drain() -> list[dict[str, Any]]:
        raw = client.lrange(key, 0, -1)
        client.delete(key)
        out = []
        for item in reversed(raw):  # kombu LPUSHes: oldest last
            message = json.loads(item)
            _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            out.append({"task": message["headers"]["task"], **kwargs})
        return out

    yield drain
    client.delete(key)
    client.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(store.database_now())


@pytest.fixture
def scheduler(clock: FakeClock) -> Iterator[beat.LeaderDatabaseScheduler]:
    """The real beat scheduler, in-process, on the fake clock."""
    instance = beat.LeaderDatabaseScheduler(app=celery_app, clock=clock)
    yield instance
    instance.close()
    for name in ("producer", "connection"):
        if name in instance.__dict__:
            instance.__dict__[name].release()


def declare(name: str, **fields: Any) -> SchedulePolicy:
    fields.setdefault("kind", "demo.noop")
    schedules.sync(declarations=[schedules.make(name=name, **fields)])
    return SchedulePolicy.objects.select_related("periodic_task").get(periodic_task__name=name)


def entry(scheduler: beat.LeaderDatabaseScheduler, name: str) -> beat.FixedEntry:
    found = scheduler.all_as_schedule()[name]
    assert isinstance(found, beat.FixedEntry)
    return found


def step(scheduler: beat.LeaderDatabaseScheduler, name: str) -> tuple[bool, float]:
    """One look of beat at the schedule: is_due, and if due carry the plan out (as Scheduler.tick does)."""
    current = entry(scheduler, name)
    due, delay = current.is_due()
    if due:
        scheduler.apply_entry(current, producer=scheduler.producer)
    return due, delay


def test_the_message_carries_the_tick_and_every_replica_computes_the_same_one(scheduler, clock, queue):
    """Two beats looking 0.4 s and 0.9 s after a tick both plan that tick; the message carries it, not the send time."""
    policy = declare("every-minute", every=60)
    tick = (policy.anchor_at.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)).astimezone(UTC)
    clock.at = tick + dt.timedelta(seconds=0.4)
    first = entry(scheduler, "every-minute")
    other_beat = beat.LeaderDatabaseScheduler(app=celery_app, clock=FakeClock(tick + dt.timedelta(seconds=0.9)))
    try:
        second = entry(other_beat, "every-minute")
        assert first.is_due()[0]
        assert second.is_due()[0]
        assert first.plan is not None
        assert second.plan is not None
        assert first.plan.sends == second.plan.sends
    finally:
        other_beat.close()
    scheduler.apply_entry(first, producer=scheduler.producer)
    signature = messages.sign("every-minute", str(policy.pk), tick.isoformat(), "beat")  # beat signs what it sends
    assert queue() == [
        {
            "task": "scheduling.run_fixed",
            "schedule": "every-minute",
            "policy": str(policy.pk),
            "tick": tick.isoformat(),
            "trigger": "beat",
            "signature": signature,
        }
    ]
    assert SchedulePolicy.objects.get(pk=policy.pk).last_tick == tick
    due, delay = step(scheduler, "every-minute")
    assert not due, "a tick is sent once"
    assert delay == pytest.approx(59.6, abs=0.01)
    assert queue() == []


def lead(scheduler: beat.LeaderDatabaseScheduler) -> None:
    """Take the beat lead, waiting for a dead leader's session to end (the server drops its lock then)."""
    for _ in range(200):
        if scheduler._ensure_leader():
            return
        time.sleep(0.05)
    raise AssertionError("the leader lock was never free")


@pytest.mark.parametrize(
    ("late_seconds", "lead_after", "sent", "missed"),
    [
        (60, 4.7, [2, 4], []),  # the standby leads 0.7 s after the 2nd tick: both unmet ticks are on time
        (5, 10.5, [6, 8, 10], [2, 4]),  # beat away 10.5 s with a 5 s tolerance: only the older two are missed
    ],
    ids=["within-tolerance", "beyond-tolerance"],
)
def test_a_handover_sends_every_tick_within_the_late_tolerance(
    scheduler, clock, queue, settings, late_seconds, lead_after, sent, missed
):
    """The leader sends a tick and dies; the standby that takes the lead sends every unmet tick within the tolerance."""
    settings.SCHEDULING_FIXED_LATE_SECONDS = late_seconds
    policy = declare("handover-2s", every=2, failed_history_limit=20)
    first = cron.interval_next_after(policy.anchor_at, 2)  # the schedule's first tick
    standby_clock = FakeClock(first)
    standby = beat.LeaderDatabaseScheduler(app=celery_app, clock=standby_clock)
    try:
        lead(scheduler)
        assert not standby._ensure_leader(), "one leader at a time"
        clock.at = first + dt.timedelta(seconds=0.3)
        assert step(scheduler, "handover-2s")[0]
        assert [(m["tick"], m["trigger"]) for m in queue()] == [(first.isoformat(), "beat")]
        scheduler._leadership._drop()  # kill -9: the lock's session ends without an unlock
        standby_clock.at = first + dt.timedelta(seconds=lead_after)
        lead(standby)
        assert step(standby, "handover-2s")[0]
        expected = [(first + dt.timedelta(seconds=n)).isoformat() for n in sent]
        assert [(m["tick"], m["trigger"]) for m in queue()] == [(tick, "beat") for tick in expected]
        rows = ScheduleRun.objects.filter(schedule=policy, state="missed").order_by("tick")
        assert [r.tick for r in rows] == [first + dt.timedelta(seconds=n) for n in missed]
        assert SchedulePolicy.objects.get(pk=policy.pk).last_tick == first + dt.timedelta(seconds=sent[-1])
        assert not step(standby, "handover-2s")[0], "each tick is handled once"
    finally:
        standby.close()


@pytest.mark.parametrize(
    ("day", "expected"),
    [
        ((2026, 3, 28), [dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC), dt.datetime(2026, 3, 30, 0, 30, tzinfo=UTC)]),
        ((2026, 10, 24), [dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC), dt.datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]),
    ],
    ids=["spring-forward", "fall-back"],
)
def test_beat_walks_a_lisbon_dst_day(scheduler, clock, queue, settings, day, expected):
    """01:30 Lisbon on beat's entry with a controlled clock: 02:00 WEST in March, the first 01:30 in October."""
    settings.SCHEDULING_FIXED_RECHECK_SECONDS = 1800
    policy = declare("lisbon-0130", cron="30 1 * * *", timezone="Europe/Lisbon")
    start = dt.datetime(*day, 12, tzinfo=UTC)
    SchedulePolicy.objects.filter(pk=policy.pk).update(anchor_at=start, last_tick=None)
    clock.at = start
    looks = 0
    while clock.at < start + dt.timedelta(days=2):
        _, delay = step(scheduler, "lisbon-0130")
        clock.at += dt.timedelta(seconds=delay + 0.25)
        looks += 1
    sent = queue()
    assert [dt.datetime.fromisoformat(m["tick"]) for m in sent] == expected
    assert {m["trigger"] for m in sent} == {"beat"}
    assert not ScheduleRun.objects.filter(schedule=policy).exists(), "nothing missed"
    assert looks < 200, "beat sleeps until the next tick (or a re-check), it does not poll every second"


@pytest.mark.parametrize(
    ("fields", "sent", "missed"),
    [
        ({}, [], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        ({"missed_policy": "run_once", "starting_deadline_seconds": 120}, [10], [1, 2, 3, 4, 5, 6, 7, 8, 9]),
        ({"missed_policy": "run_all", "missed_window_seconds": 1000}, [7, 8, 9, 10], [1, 2, 3, 4, 5, 6]),
    ],
    ids=["skip", "run_once", "run_all"],
)
def test_ticks_missed_while_beat_was_down(scheduler, clock, queue, fields, sent, missed):
    """Beat back 90 s after the 10th tick it was not there for: recorded, or caught up, per missed_policy."""
    policy = declare("five-minutely", every=300, failed_history_limit=20, **fields)
    last = policy.anchor_at.replace(minute=0, second=0, microsecond=0).astimezone(UTC)
    SchedulePolicy.objects.filter(pk=policy.pk).update(anchor_at=last, last_tick=last)
    clock.at = last + dt.timedelta(minutes=50, seconds=90)
    assert step(scheduler, "five-minutely")[0]
    messages = queue()
    assert [m["tick"] for m in messages] == [(last + dt.timedelta(minutes=5 * n)).isoformat() for n in sent]
    assert {m["trigger"] for m in messages} <= {"catch_up"}
    rows = ScheduleRun.objects.filter(schedule=policy, state="missed").order_by("tick")
    assert [r.tick for r in rows] == [last + dt.timedelta(minutes=5 * n) for n in missed]
    assert all("beat was not running" in r.error for r in rows)
    assert SchedulePolicy.objects.get(pk=policy.pk).last_tick == last + dt.timedelta(minutes=50)
    assert not step(scheduler, "five-minutely")[0], "handled once"


def test_an_edit_moves_the_anchor_so_it_neither_fires_now_nor_loses_the_next_tick(scheduler, clock, queue):
    """Saving another crontab moves the anchor to the edit: nothing fires then, the new timing's next tick does."""
    policy = declare("edited", cron="0 3 * * *", timezone="Europe/Lisbon")
    long_ago = clock.at - dt.timedelta(days=3)
    SchedulePolicy.objects.filter(pk=policy.pk).update(anchor_at=long_ago, last_tick=long_ago)
    every_minute, _ = CrontabSchedule.objects.get_or_create(
        minute="*", hour="*", day_of_month="*", month_of_year="*", day_of_week="*", timezone="Europe/Lisbon"
    )
    task = PeriodicTask.objects.get(name="edited")
    task.crontab = every_minute
    task.save()
    edited = SchedulePolicy.objects.get(pk=policy.pk)
    assert edited.anchor_at > long_ago
    assert edited.timing_key.startswith("cron * * * * * Europe/Lisbon")
    clock.at = edited.anchor_at + dt.timedelta(microseconds=1)
    due, _ = step(scheduler, "edited")
    assert not due, "three days of the new timing's ticks do not fire (nor count as missed) at the edit"
    assert not ScheduleRun.objects.filter(schedule=policy).exists()
    next_tick = (edited.anchor_at.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)).astimezone(UTC)
    clock.at = next_tick + dt.timedelta(seconds=0.2)
    assert step(scheduler, "edited")[0]
    assert [m["tick"] for m in queue()] == [next_tick.isoformat()]


def test_an_edit_bypassing_the_signals_is_caught_by_beat(scheduler, clock, queue):
    """A QuerySet.update() of the crontab moves no anchor by itself; beat sees the fingerprint change and does."""
    policy = declare("updated", cron="0 3 * * *", timezone="Europe/Lisbon")
    long_ago = clock.at - dt.timedelta(days=3)
    SchedulePolicy.objects.filter(pk=policy.pk).update(anchor_at=long_ago, last_tick=long_ago)
    every_minute, _ = CrontabSchedule.objects.get_or_create(
        minute="*", hour="*", day_of_month="*", month_of_year="*", day_of_week="*", timezone="Europe/Lisbon"
    )
    PeriodicTask.objects.filter(name="updated").update(crontab=every_minute)
    assert SchedulePolicy.objects.get(pk=policy.pk).anchor_at == long_ago
    assert not step(scheduler, "updated")[0]
    assert SchedulePolicy.objects.get(pk=policy.pk).anchor_at == clock.at
    assert queue() == []
    assert not ScheduleRun.objects.filter(schedule=policy).exists()


def test_a_suspended_schedule_fires_nothing_and_resuming_does_not_catch_up(scheduler, clock, queue):
    """Suspended for five minutes: no message, no row; after resuming, only ticks after the resume fire."""
    policy = declare("paused", every=60)
    SchedulePolicy.objects.filter(pk=policy.pk).update(suspend=True)
    clock.at += dt.timedelta(minutes=5)
    assert not step(scheduler, "paused")[0]
    SchedulePolicy.objects.filter(pk=policy.pk).update(suspend=False)
    assert not step(scheduler, "paused")[0], "resuming counts from now"
    assert not ScheduleRun.objects.filter(schedule=policy).exists()
    resumed_at = SchedulePolicy.objects.get(pk=policy.pk).anchor_at
    assert resumed_at == clock.at
    next_tick = (resumed_at.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)).astimezone(UTC)
    clock.at = next_tick
    assert step(scheduler, "paused")[0]
    assert [m["tick"] for m in queue()] == [next_tick.isoformat()]


def test_fixed_time_crontabs_are_always_loaded(scheduler, clock):
    """A 03:00 Lisbon schedule is in beat's entries at any hour; django-celery-beat's own filter drops it at some."""
    declare("far-hour", cron="0 3 * * *", timezone="Europe/Lisbon")
    names = {model.name for model in scheduler.enabled_models()}
    assert "far-hour" in names
    plain = DatabaseScheduler(app=celery_app, lazy=True)
    hours_away = (dt.datetime.now(UTC).hour - 3) % 24
    if 3 <= hours_away <= 21:  # outside django-celery-beat's +-2 h window (zone offsets aside)
        assert "far-hour" not in {model.name for model in plain.enabled_models()}


def test_the_leader_writes_its_heartbeat_and_a_new_lead_restarts_leading_since(scheduler):
    """The leader's heartbeat row names it; later beats keep "leading since", a new leadership restarts it."""
    assert scheduler._ensure_leader()
    scheduler._write_heartbeat()
    first = SchedulerHeartbeat.objects.get(role=beat.HEARTBEAT_ROLE)
    assert first.holder == leadership.process_name()
    scheduler._last_heartbeat = 0.0
    scheduler._write_heartbeat()
    again = SchedulerHeartbeat.objects.get(role=beat.HEARTBEAT_ROLE)
    assert again.acquired_at == first.acquired_at
    assert again.heartbeat_at >= first.heartbeat_at
    long_ago = first.acquired_at - dt.timedelta(days=1)
    SchedulerHeartbeat.objects.filter(role=beat.HEARTBEAT_ROLE).update(acquired_at=long_ago)
    scheduler._leadership.resign()
    assert scheduler._ensure_leader()
    scheduler._write_heartbeat()
    assert SchedulerHeartbeat.objects.get(role=beat.HEARTBEAT_ROLE).acquired_at > long_ago
    assert SchedulerHeartbeat.objects.count() == 1


def test_a_leader_that_cannot_reach_the_broker_steps_down_and_another_beat_leads(clock, monkeypatch, caplog):
    """Redis unreachable from the leading beat (a closed port), PostgreSQL fine: after
    BROKER_FAILURES_TO_STEP_DOWN ticks whose sends failed it gives the lead up (logged), another beat
    takes it, and the stepped-down beat does not try again within STEP_DOWN_HOLD_SECONDS."""
    from celery import Celery

    from tests.e2e import private_services

    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{private_services.free_port()}/0")
    unreachable = Celery("unreachable", set_as_current=False)
    unreachable.config_from_object("django.conf:settings", namespace="CELERY")
    unreachable.conf.broker_connection_timeout = 1
    unreachable.conf.broker_connection_max_retries = 1
    policy = declare("unsendable", every=2)
    clock.at = policy.anchor_at + dt.timedelta(seconds=2.5)
    caplog.set_level("INFO", logger="scheduling")
    cut_off = beat.LeaderDatabaseScheduler(app=unreachable, clock=clock)
    standby = beat.LeaderDatabaseScheduler(app=celery_app, clock=clock)
    try:
        for _ in range(beat.BROKER_FAILURES_TO_STEP_DOWN * 3):  # a tick may only (re)read the schedule
            cut_off.tick()
            if cut_off.step_downs:
                break
        assert cut_off.step_downs == 1
        assert not cut_off.is_leader
        assert [r for r in caplog.records if getattr(r, "action", "") == "stepped_down"]
        assert SchedulePolicy.objects.get(pk=policy.pk).last_tick is None, "nothing advanced: the tick is still owed"
        assert standby._ensure_leader(), "another beat takes the lead"
        standby._leadership.resign()
        assert not cut_off._ensure_leader(), "the stepped-down beat holds off"
    finally:
        cut_off.close()
        standby.close()
        from django.db import connection

        connection.close()  # the leading tick bounded this session for beat, not for the tests that follow


def test_the_leading_beats_own_session_asks_the_server_to_end_it_when_its_host_vanishes(scheduler):
    """A leading beat's Django session carries the vanished-client bounds (a beat cut off in the middle
    of a transaction leaves no row lock for longer than locks.VANISHED_CLIENT_BOUND_SECONDS)."""
    from django.db import connection

    from scheduling.core import locks

    scheduler.tick()
    assert scheduler.is_leader
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        assert cursor.fetchone()[0] == f"{locks.IDLE_IN_TRANSACTION_SECONDS}s"
        cursor.execute("SHOW tcp_user_timeout")
        assert cursor.fetchone()[0] in {str(locks.SERVER_USER_TIMEOUT_MS), "0"}  # 0 over a Unix socket
    connection.close()  # the bounds are for beat's session, not for the tests that follow


def test_a_scheduler_asked_for_while_the_first_is_being_built_exits_without_a_second_build(monkeypatch):
    """Celery's stop handler asks for the scheduler to save it; a stop that lands inside the first build
    (django-celery-beat's first read of the schedule) must not build a second on the same connection."""
    seen = []

    def first_read(self: Any, *args: Any, **kwargs: Any) -> None:  # the parent's build, where the stop lands
        with pytest.raises(SystemExit):
            beat.LeaderDatabaseScheduler(app=celery_app)  # what celery.apps.beat's _sync does then
        seen.append("the second build exited")

    monkeypatch.setattr(DatabaseScheduler, "__init__", first_read)
    beat.LeaderDatabaseScheduler(app=celery_app)
    assert seen == ["the second build exited"]
    beat.LeaderDatabaseScheduler(app=celery_app)  # built, not building: the next one is built as usual
    assert seen == ["the second build exited"] * 2


@pytest.mark.parametrize("missed", ["skip", "run_all"])
def test_disabled_and_enabled_again_from_the_list_counts_from_the_enable(scheduler, clock, queue, missed):
    """The list's Disable/Enable actions (a QuerySet.update, no signal; beat never loads a disabled task) move
    the anchor to the enable: the time it was off is neither recorded missed nor replayed."""
    policy = declare("switched", every=60, missed_policy=missed)
    edits.disable([policy.periodic_task_id])
    long_ago = clock.at - dt.timedelta(minutes=10)
    SchedulePolicy.objects.filter(pk=policy.pk).update(anchor_at=long_ago, last_tick=long_ago)  # off for ten minutes
    edits.enable([policy.periodic_task_id])
    enabled = SchedulePolicy.objects.get(pk=policy.pk)
    assert enabled.anchor_at > long_ago
    clock.at = enabled.anchor_at + dt.timedelta(microseconds=1)
    assert not step(scheduler, "switched")[0]
    assert queue() == []
    assert not ScheduleRun.objects.filter(schedule=policy).exists(), "no missed rows, no catch-up runs"


@pytest.mark.django_db
def test_beats_database_clock_does_not_follow_a_step_of_the_hosts_wall_clock(monkeypatch):
    """Between two reads of the database clock, beat's clock runs on time.monotonic(): a step of the host's
    wall clock (+10 minutes: an NTP step, a VM resumed) moved it, and beat recorded the next ten minutes'
    ticks as missed and sent one early (found by review)."""
    clock = beat.DatabaseClock()
    clock.now()  # read the database clock
    stepped = time.time() + 600
    monkeypatch.setattr(time, "time", lambda: stepped)
    seen = clock.now()
    monkeypatch.undo()
    assert abs((seen - store.database_now()).total_seconds()) < 60, "not ten minutes ahead"
