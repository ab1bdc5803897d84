"""Beat's due-ness for fixed-time schedules (``scheduling.fixed.ticks.plan``) walked with a controlled clock.

``scheduling.fixed.cron``'s own tests cover the tick arithmetic; these drive the planner the way beat
does (look, carry out, sleep until the next tick or a re-check, wake a little late) across the
Lisbon DST days of 2026, after downtime, and through edits.
"""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling import exceptions, schedules
from scheduling.fixed import ticks

LISBON = ZoneInfo("Europe/Lisbon")
LATE = 60.0
MAX_TICKS = 100


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@dataclasses.dataclass
class SimulatedBeat:
    """Beat's loop around one schedule: plan at the clock's now, carry out, sleep, repeat."""

    state: ticks.TickState
    recheck_seconds: float = 97.0  # wake up at odd moments too, not only at ticks
    sent: list[ticks.Send] = dataclasses.field(default_factory=list)
    missed: list[datetime] = dataclasses.field(default_factory=list)

    def run(self, start: datetime, end: datetime, seed: int = 7) -> SimulatedBeat:
        """Beat runs from ``start`` to ``end``; it was running before ``start`` too (nothing is pending then)."""
        rng = random.Random(seed)
        if self.state.last_tick is None:
            self.state = dataclasses.replace(self.state, last_tick=start)
        now = start
        while now <= end:
            plan = ticks.plan(self.state, now, late_seconds=LATE, max_ticks=MAX_TICKS)
            self.sent.extend(plan.sends)
            self.missed.extend(plan.missed)
            if plan.advance_to is not None:
                self.state = dataclasses.replace(self.state, last_tick=plan.advance_to)
            wait = ticks.seconds_until(plan.next_tick, now, self.recheck_seconds)
            now += timedelta(seconds=wait + rng.uniform(0.0, 0.9))  # beat wakes a little late
        return self

    @property
    def ticks(self) -> list[datetime]:
        return [send.tick for send in self.sent]


def daily(expression: str, dst_gap: str = "shift") -> ticks.TickState:
    timing = ticks.Timing.from_cron(expression, "Europe/Lisbon", dst_gap)
    return ticks.TickState(timing=timing, anchor_at=utc(2026, 1, 1))


def test_0130_runs_once_on_the_fall_back_day():
    """01:30 Lisbon fires once on 25 Oct 2026 (first 01:30, WEST) although the wall clock shows it twice."""
    beat = SimulatedBeat(daily("30 1 * * *")).run(utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert beat.ticks == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    assert all(send.trigger == "beat" for send in beat.sent)
    assert beat.missed == []
    assert [t.astimezone(LISBON).strftime("%H:%M %Z") for t in beat.ticks] == ["01:30 WEST", "01:30 WET"]


def test_0130_shifts_to_the_end_of_the_gap_on_the_spring_forward_day():
    """01:30 does not exist on 29 Mar 2026: with shift it runs at 02:00 WEST (01:00 UTC), once."""
    beat = SimulatedBeat(daily("30 1 * * *")).run(utc(2026, 3, 28, 12), utc(2026, 3, 30, 12))
    assert beat.ticks == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    assert beat.ticks[0].astimezone(LISBON).strftime("%H:%M %Z") == "02:00 WEST"


def test_0130_does_not_run_on_the_spring_forward_day_with_skip():
    """With dst_gap="skip" the 29 Mar 2026 run is left out, and not recorded as missed either."""
    beat = SimulatedBeat(daily("30 1 * * *", "skip")).run(utc(2026, 3, 28, 12), utc(2026, 3, 30, 12))
    assert beat.ticks == [utc(2026, 3, 30, 0, 30)]
    assert beat.missed == []


def test_0300_stays_at_0300_local_across_both_changes():
    """A 03:00 Lisbon schedule runs at 03:00 on the wall clock before, on and after both 2026 changes."""
    spring = SimulatedBeat(daily("0 3 * * *")).run(utc(2026, 3, 27, 12), utc(2026, 3, 30, 12))
    autumn = SimulatedBeat(daily("0 3 * * *")).run(utc(2026, 10, 23, 12), utc(2026, 10, 26, 12))
    assert spring.ticks == [utc(2026, 3, 28, 3), utc(2026, 3, 29, 2), utc(2026, 3, 30, 2)]
    assert autumn.ticks == [utc(2026, 10, 24, 2), utc(2026, 10, 25, 3), utc(2026, 10, 26, 3)]
    for tick in spring.ticks + autumn.ticks:
        assert tick.astimezone(LISBON).strftime("%H:%M") == "03:00"


def test_quarter_hourly_schedule_keeps_its_cadence_through_the_repeated_hour():
    """Every 15 min on the fall-back night: 01:00-01:45 WEST and again WET, every 15 real minutes, nothing missed."""
    beat = SimulatedBeat(daily("*/15 * * * *"), recheck_seconds=5)
    beat.run(utc(2026, 10, 24, 23, 50), utc(2026, 10, 25, 2, 5))
    local = [t.astimezone(LISBON).strftime("%H:%M %Z") for t in beat.ticks]
    assert local == [f"01:{m:02d} {zone}" for zone in ("WEST", "WET") for m in (0, 15, 30, 45)] + ["02:00 WET"]
    assert {b - a for a, b in zip(beat.ticks, beat.ticks[1:], strict=False)} == {timedelta(minutes=15)}
    assert all(send.trigger == "beat" for send in beat.sent)
    assert beat.missed == []


@pytest.mark.parametrize(
    ("nickname", "explicit"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_declared_nickname_is_the_same_schedule_as_its_expansion(nickname, explicit):
    """A schedule declared with a nickname has the same timing and the same beat ticks as the five fields."""
    by_name = schedules.make(name="n", kind="k", cron=nickname, timezone="Europe/Lisbon")
    by_fields = schedules.make(name="n", kind="k", cron=explicit, timezone="Europe/Lisbon")
    assert by_name.timing.key == by_fields.timing.key
    if nickname in ("@yearly", "@annually"):
        start, end = utc(2026, 12, 30), utc(2027, 1, 2)
    elif nickname == "@monthly":
        start, end = utc(2026, 3, 30), utc(2026, 4, 2)
    else:  # a week around the spring-forward day
        start, end = utc(2026, 3, 26), utc(2026, 4, 2)
    anchor = utc(2026, 1, 1)
    walk_name = SimulatedBeat(ticks.TickState(by_name.timing, anchor), recheck_seconds=3_600).run(start, end)
    walk_fields = SimulatedBeat(ticks.TickState(by_fields.timing, anchor), recheck_seconds=3_600).run(start, end)
    assert walk_name.ticks == walk_fields.ticks
    assert walk_name.ticks, "the walk saw ticks"
    assert by_name.timing.describe().startswith(f"{nickname}: ")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"cron": "61 * * * *"}, exceptions.InvalidCronExpression),
        ({"cron": "@reboot"}, exceptions.InvalidCronExpression),
        ({"cron": "0 3 * * *", "timezone": "Europe/Lisboa"}, exceptions.UnknownTimeZone),
        ({"cron": "0 3 * * *", "every": 60}, exceptions.InvalidSchedule),
        ({"every": 0}, exceptions.InvalidSchedule),
        ({"every": 2**31}, exceptions.InvalidSchedule),  # IntervalSchedule.every is an integer column
        ({"every": 10**400}, exceptions.InvalidSchedule),  # math.isfinite() overflowed on it
        ({"every": float("nan")}, exceptions.InvalidSchedule),  # int() of it was a ValueError
        ({"every": float("inf")}, exceptions.InvalidSchedule),  # and an OverflowError
        ({"every": True}, exceptions.InvalidSchedule),
        ({"every": "60"}, exceptions.InvalidSchedule),
        ({"every": 60, "timezone": "Europe/Lisbon"}, exceptions.InvalidSchedule),
        ({"every": 60, "active_deadline_seconds": 60}, exceptions.InvalidPolicy),
        ({"cron": "0 3 * * *", "timezone": "Europe/Lisbon", "active_deadline_seconds": 82_800}, exceptions.InvalidPolicy),  # noqa: E501
        ({"cron": "0 3 * * *", "dst_gap": "later"}, exceptions.InvalidPolicy),
    ],
)
def test_invalid_declarations_are_refused(fields, error):
    """Bad expressions, unknown zones, both/neither timing and a timeout not under the interval are refused."""
    with pytest.raises(error):
        schedules.make(name="bad", kind="k", **fields)


def test_timeout_limit_counts_the_short_dst_day():
    """A daily 03:00 Lisbon schedule's shortest interval is 23 h (spring forward), so 23 h of timeout is refused."""
    ok = schedules.make(name="ok", kind="k", cron="0 3 * * *", timezone="Europe/Lisbon", active_deadline_seconds=79_200)
    assert ok.timing.min_interval_seconds() == 82_800
    with pytest.raises(exceptions.InvalidPolicy, match="shorter than its shortest interval"):
        schedules.make(name="no", kind="k", cron="0 3 * * *", timezone="Europe/Lisbon", active_deadline_seconds=82_800)


def every_five_minutes(**policy: object) -> ticks.TickState:
    return ticks.TickState(
        timing=ticks.Timing.from_interval(300), anchor_at=utc(2026, 5, 1), last_tick=utc(2026, 5, 4, 10), **policy
    )


def test_skip_records_every_tick_missed_while_beat_was_down():
    """Beat back at 10:32:30 after a stop at 10:00: the six ticks 10:05-10:30 are missed, none sent."""
    plan = ticks.plan(every_five_minutes(), utc(2026, 5, 4, 10, 32, 30), late_seconds=LATE, max_ticks=MAX_TICKS)
    assert plan.sends == ()
    assert plan.missed == tuple(utc(2026, 5, 4, 10, m) for m in (5, 10, 15, 20, 25, 30))
    assert plan.advance_to == utc(2026, 5, 4, 10, 30)
    assert plan.next_tick == utc(2026, 5, 4, 10, 35)


def test_a_tick_noticed_within_the_late_tolerance_is_sent_on_time():
    """Beat back at 10:30:20: 10:30 is sent as an ordinary tick; the earlier ones are missed."""
    plan = ticks.plan(every_five_minutes(), utc(2026, 5, 4, 10, 30, 20), late_seconds=LATE, max_ticks=MAX_TICKS)
    assert plan.sends == (ticks.Send(utc(2026, 5, 4, 10, 30), "beat"),)
    assert plan.missed == tuple(utc(2026, 5, 4, 10, m) for m in (5, 10, 15, 20, 25))


@pytest.mark.parametrize("missed_policy", ["skip", "run_once", "run_all"])
def test_a_handover_sends_every_tick_within_the_late_tolerance(missed_policy):
    """A 2 s schedule whose leader died after 10:00:00: the next leader at 10:00:04.7 sends :02 and :04, misses none."""
    state = ticks.TickState(
        timing=ticks.Timing.from_interval(2),
        anchor_at=utc(2026, 5, 1),
        last_tick=utc(2026, 5, 4, 10),
        missed_policy=missed_policy,
    )
    now = utc(2026, 5, 4, 10) + timedelta(seconds=4.7)
    plan = ticks.plan(state, now, late_seconds=LATE, max_ticks=MAX_TICKS)
    assert plan.sends == (ticks.Send(utc(2026, 5, 4, 10, 0, 2), "beat"), ticks.Send(utc(2026, 5, 4, 10, 0, 4), "beat"))
    assert plan.missed == ()
    assert plan.advance_to == utc(2026, 5, 4, 10, 0, 4)


def test_only_ticks_older_than_the_late_tolerance_follow_the_missed_policy():
    """Late tolerance 5 s, beat back 10.5 s after its last tick: 10:00:02 and :04 are missed, :06 to :10 are sent."""
    state = ticks.TickState(
        timing=ticks.Timing.from_interval(2), anchor_at=utc(2026, 5, 1), last_tick=utc(2026, 5, 4, 10)
    )
    plan = ticks.plan(state, utc(2026, 5, 4, 10) + timedelta(seconds=10.5), late_seconds=5, max_ticks=MAX_TICKS)
    assert plan.missed == (utc(2026, 5, 4, 10, 0, 2), utc(2026, 5, 4, 10, 0, 4))
    assert plan.sends == tuple(ticks.Send(utc(2026, 5, 4, 10, 0, s), "beat") for s in (6, 8, 10))


def test_run_once_sends_the_latest_missed_tick_within_the_starting_deadline():
    """run_once: the latest missed tick (10:30, 150 s old) runs once when the deadline allows it."""
    now = utc(2026, 5, 4, 10, 32, 30)
    plan = ticks.plan(
        every_five_minutes(missed_policy="run_once", starting_deadline_seconds=300),
        now,
        late_seconds=LATE,
        max_ticks=MAX_TICKS,
    )
    assert plan.sends == (ticks.Send(utc(2026, 5, 4, 10, 30), "catch_up"),)
    assert plan.missed == tuple(utc(2026, 5, 4, 10, m) for m in (5, 10, 15, 20, 25))
    too_late = ticks.plan(
        every_five_minutes(missed_policy="run_once", starting_deadline_seconds=120),
        now,
        late_seconds=LATE,
        max_ticks=MAX_TICKS,
    )
    assert too_late.sends == ()
    assert len(too_late.missed) == 6


def test_run_all_sends_each_missed_tick_within_the_window():
    """run_all with a 15-minute window: 10:20, 10:25 and 10:30 run, in order; 10:05-10:15 are recorded."""
    plan = ticks.plan(
        every_five_minutes(missed_policy="run_all", missed_window_seconds=900),
        utc(2026, 5, 4, 10, 32, 30),
        late_seconds=LATE,
        max_ticks=MAX_TICKS,
    )
    assert plan.sends == tuple(ticks.Send(utc(2026, 5, 4, 10, m), "catch_up") for m in (20, 25, 30))
    assert plan.missed == tuple(utc(2026, 5, 4, 10, m) for m in (5, 10, 15))


def test_a_long_outage_of_a_fast_schedule_looks_at_the_latest_ticks_only():
    """A day down for an every-second schedule: only the latest 100 ticks are examined, and that is said."""
    state = ticks.TickState(ticks.Timing.from_interval(1), anchor_at=utc(2026, 5, 1), last_tick=utc(2026, 5, 3))
    plan = ticks.plan(state, utc(2026, 5, 4), late_seconds=LATE, max_ticks=MAX_TICKS)
    assert len(plan.missed) + len(plan.sends) == MAX_TICKS
    assert plan.missed_more
    assert plan.advance_to == utc(2026, 5, 4)


def test_suspended_schedule_plans_nothing():
    """A suspended schedule neither sends nor records anything, however many ticks pass."""
    beat = SimulatedBeat(dataclasses.replace(every_five_minutes(), suspended=True)).run(
        utc(2026, 5, 4, 10), utc(2026, 5, 4, 12)
    )
    assert beat.sent == []
    assert beat.missed == []


def test_two_beats_looking_at_different_moments_compute_the_same_tick():
    """The tick is a value of the schedule: two replicas looking 0.3 s and 0.9 s after it send the same instant."""
    state = every_five_minutes()
    first = ticks.plan(state, utc(2026, 5, 4, 10, 5, 0) + timedelta(seconds=0.3), late_seconds=LATE, max_ticks=5)
    second = ticks.plan(state, utc(2026, 5, 4, 10, 5, 0) + timedelta(seconds=0.9), late_seconds=LATE, max_ticks=5)
    assert first.sends == second.sends == (ticks.Send(utc(2026, 5, 4, 10, 5), "beat"),)


def test_an_edit_does_not_fire_at_once():
    """Moving 03:00 to 04:00 at 04:00:30 (today's 03:00 ran) fires nothing now; the next run is tomorrow 04:00.

    Counting from the last run instead (django-celery-beat #537, #683) would fire it at once.
    """
    edited_at = utc(2026, 6, 10, 3, 0, 30)  # 04:00:30 WEST
    state = ticks.TickState(
        timing=ticks.Timing.from_cron("0 4 * * *", "Europe/Lisbon"),
        anchor_at=edited_at,
        last_tick=utc(2026, 6, 10, 2),  # today's 03:00 WEST run
    )
    beat = SimulatedBeat(state).run(edited_at, utc(2026, 6, 11, 12))
    assert beat.ticks == [utc(2026, 6, 11, 3)]
    assert beat.missed == []
    from_last_run = dataclasses.replace(state, anchor_at=utc(2026, 6, 1))
    assert ticks.plan(from_last_run, edited_at, late_seconds=LATE, max_ticks=5).sends, "the counterfactual fires"


def test_an_edit_does_not_lose_the_next_tick():
    """Moving 03:00 to 04:00 at 03:30 (before the new time) still runs at 04:00 the same day."""
    edited_at = utc(2026, 6, 10, 2, 30)  # 03:30 WEST
    state = ticks.TickState(
        timing=ticks.Timing.from_cron("0 4 * * *", "Europe/Lisbon"),
        anchor_at=edited_at,
        last_tick=utc(2026, 6, 10, 2),
    )
    beat = SimulatedBeat(state).run(edited_at, utc(2026, 6, 11, 12))
    assert beat.ticks == [utc(2026, 6, 10, 3), utc(2026, 6, 11, 3)]


def test_interval_ticks_sit_on_the_epoch_grid():
    """Interval ticks are multiples of the interval since the Unix epoch, whoever computes them."""
    timing = ticks.Timing.from_interval(7)
    tick = timing.latest_at_or_before(utc(2026, 5, 4, 10, 0, 3))
    assert tick is not None
    assert int(tick.timestamp()) % 7 == 0
    assert timing.describe() == "Every 7 seconds"
    assert ticks.Timing.from_interval(3600).describe() == "Every 1 hour"


def test_the_pure_modules_names_are_the_models_choices():
    """ticks' triggers and missed policies and cron's DST-gap rules are the values of the models' TextChoices."""
    from scheduling.fixed import cron
    from scheduling.models import DstGapPolicy, MissedPolicy, RunTrigger

    assert (ticks.TRIGGER_BEAT, ticks.TRIGGER_CATCH_UP) == (RunTrigger.BEAT, RunTrigger.CATCH_UP)
    assert tuple(MissedPolicy.values) == (ticks.MISSED_SKIP, ticks.MISSED_RUN_ONCE, ticks.MISSED_RUN_ALL)
    assert set(cron.DST_GAP_CHOICES) == set(DstGapPolicy.values)
