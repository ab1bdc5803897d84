"""Which ticks of a fixed-time schedule are due, decided from the schedule's state and a clock.

Pure Python: no database, no Celery. Beat (``scheduling.fixed.beat``) reads a schedule's row into a
``TickState``, asks ``plan()`` what to do at its clock's ``now``, carries the plan out, and
records the progress in ``last_tick``. Any beat replica that reads the same row computes the same
ticks, because a tick is a value of the schedule (``scheduling.fixed.cron``), never the time of sending.

Semantics
    * **Counting from.** Ticks at or before ``since = max(anchor_at, last_tick)`` are done with:
      ``anchor_at`` is when the schedule (or its timing) last changed, ``last_tick`` the latest
      tick beat handled. So a new or edited schedule never fires a tick from before the change
      (django-celery-beat #537/#683 fired edited schedules at once) and never loses the next one.
    * **On time.** Every unhandled tick at most ``late_seconds`` old is sent with trigger
      ``beat``, in order, whichever replica leads: a leader handover or a beat restart within
      the tolerance loses nothing, even when several ticks came due meanwhile (a 2 s schedule
      whose leader was killed: the standby sends both ticks of the 3 s it took to lead).
    * **Missed.** An unhandled tick older than ``late_seconds`` was missed (beat was down or
      stalled longer than that). The schedule's ``missed_policy`` decides: ``skip`` records them
      as missed runs; ``run_once`` sends the latest of them (trigger ``catch_up``) if it is within
      the starting deadline and no on-time tick is being sent, recording the rest; ``run_all``
      sends each one within the missed-tick window and the starting deadline (the gate would
      refuse the others), recording the rest. At most ``max_ticks`` ticks are looked at per step:
      the most recent ones.
    * **Suspended.** Nothing is sent or recorded. Resuming changes the timing fingerprint, which
      moves the anchor (``policies``), so the suspended stretch neither fires nor counts as missed.
    * **Time zones.** Cron ticks follow ``scheduling.fixed.cron`` (Debian cron's rule): a fixed-time
      schedule fires a repeated wall time at its first occurrence and a skipped one at the end of
      the gap (``dst_gap="shift"``) or not at all (``"skip"``); a wildcard one (``*/15 * * * *``)
      keeps its real-time cadence. Interval ticks sit on a grid from the Unix epoch.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Final

from scheduling.core import exceptions
from scheduling.fixed import cron

TRIGGER_BEAT: Final = "beat"
TRIGGER_CATCH_UP: Final = "catch_up"

MISSED_SKIP: Final = "skip"
MISSED_RUN_ONCE: Final = "run_once"
MISSED_RUN_ALL: Final = "run_all"

_ONE_MICROSECOND: Final = dt.timedelta(microseconds=1)


@dataclasses.dataclass(frozen=True)
class Timing:
    """When a schedule ticks: a cron expression in a zone, or a fixed interval in seconds."""

    crontab: cron.CronSchedule | None = None
    every_seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.crontab is None) == (self.every_seconds is None):
            raise exceptions.InvalidSchedule("A timing is either a cron schedule or an interval, not both or neither.")
        if self.every_seconds is not None:
            cron.interval_tick(cron.EPOCH, self.every_seconds)  # validates the interval

    @classmethod
    def from_cron(cls, expression: str, timezone: str, dst_gap: str = cron.DST_GAP_SHIFT) -> Timing:
        """Validated: ``InvalidCronExpression``, ``UnknownTimeZone`` or ``InvalidPolicy`` (dst_gap)."""
        return cls(crontab=cron.CronSchedule.parse(expression, timezone, dst_gap))

    @classmethod
    def from_interval(cls, every_seconds: float) -> Timing:
        """Validated: ``InvalidSchedule`` unless a positive number of seconds."""
        return cls(every_seconds=every_seconds)

    @property
    def timezone(self) -> str:
        """The zone the schedule runs in (UTC for intervals, which have no wall clock)."""
        return self.crontab.timezone if self.crontab is not None else "UTC"

    @property
    def key(self) -> str:
        """A fingerprint of the timing: equal keys tick at the same instants."""
        if self.crontab is not None:
            return f"cron {self.crontab.expanded} {self.crontab.timezone} {self.crontab.dst_gap}"
        return f"every {self.every_seconds!r}s"

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        """The first tick strictly after ``instant``."""
        if self.crontab is not None:
            return self.crontab.next_after(instant)
        assert self.every_seconds is not None
        return cron.interval_next_after(instant, self.every_seconds)

    def latest_at_or_before(self, instant: dt.datetime) -> dt.datetime | None:
        """The latest tick at or before ``instant`` (None if a cron schedule has none in years)."""
        if self.crontab is not None:
            return self.crontab.latest_at_or_before(instant)
        assert self.every_seconds is not None
        return cron.interval_tick(instant, self.every_seconds)

    def recent_ticks(self, after: dt.datetime, until: dt.datetime, limit: int) -> tuple[list[dt.datetime], bool]:
        """The latest ``limit`` ticks ``t`` with ``after < t <= until``, ascending, and whether there were more."""
        found: list[dt.datetime] = []
        cursor = until
        while len(found) < limit:
            tick = self.latest_at_or_before(cursor)
            if tick is None or tick <= after:
                return found[::-1], False
            found.append(tick)
            cursor = tick - _ONE_MICROSECOND
        following = self.latest_at_or_before(cursor)
        return found[::-1], following is not None and following > after

    def next_n(self, after: dt.datetime, n: int) -> list[dt.datetime]:
        """The first ``n`` ticks strictly after ``after`` (for previews)."""
        ticks: list[dt.datetime] = []
        cursor = after
        for _ in range(max(0, n)):
            cursor = self.next_after(cursor)
            ticks.append(cursor)
        return ticks

    def min_interval_seconds(self) -> float:
        """The shortest gap between two ticks (DST days included for cron)."""
        if self.crontab is not None:
            return self.crontab.min_interval_seconds()
        assert self.every_seconds is not None
        return float(self.every_seconds)

    def describe(self) -> str:
        """A readable description, e.g. ``At 03:00 AM (Europe/Lisbon)`` or ``Every 2 seconds``."""
        if self.crontab is not None:
            return self.crontab.describe()
        assert self.every_seconds is not None
        return f"Every {_seconds_text(self.every_seconds)}"


def _seconds_text(seconds: float) -> str:
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    if seconds == int(seconds):
        return f"{int(seconds)} second{'s' if seconds != 1 else ''}"
    return f"{seconds:g} seconds"


@dataclasses.dataclass(frozen=True)
class TickState:
    """What beat needs to know about one schedule, read from its row."""

    timing: Timing
    anchor_at: dt.datetime
    last_tick: dt.datetime | None = None
    suspended: bool = False
    missed_policy: str = MISSED_SKIP
    missed_window_seconds: float = 3600.0
    starting_deadline_seconds: float | None = None

    @property
    def since(self) -> dt.datetime:
        """Ticks at or before this instant are done with."""
        if self.last_tick is not None and self.last_tick > self.anchor_at:
            return self.last_tick
        return self.anchor_at


@dataclasses.dataclass(frozen=True)
class Send:
    """A tick to send to the gate, and why."""

    tick: dt.datetime
    trigger: str


@dataclasses.dataclass(frozen=True)
class TickPlan:
    """What beat does now for one schedule."""

    sends: tuple[Send, ...] = ()
    missed: tuple[dt.datetime, ...] = ()
    missed_more: bool = False  # more missed ticks than were looked at (only the latest are recorded)
    advance_to: dt.datetime | None = None  # the new last_tick once the plan is carried out
    next_tick: dt.datetime | None = None  # the first tick after now: when to look again

    @property
    def due(self) -> bool:
        """Whether there is anything to carry out."""
        return bool(self.sends or self.missed or self.advance_to)


def plan(state: TickState, now: dt.datetime, *, late_seconds: float, max_ticks: int) -> TickPlan:
    """Decide what beat does for one schedule at ``now`` (see the module docstring)."""
    next_tick = _next_tick(state.timing, now)
    if state.suspended:
        return TickPlan(next_tick=next_tick)
    since = state.since
    unmet, more = state.timing.recent_ticks(since, now, max(1, max_ticks))
    if not unmet:
        return TickPlan(next_tick=next_tick)
    latest = unmet[-1]
    on_time = [tick for tick in unmet if (now - tick).total_seconds() <= late_seconds]
    candidates = unmet[: len(unmet) - len(on_time)]  # older than the late tolerance: missed
    sends: list[Send] = []
    catch_up: list[dt.datetime] = []
    if state.missed_policy == MISSED_RUN_ONCE and not on_time and candidates:
        newest = candidates[-1]
        if _within(now - newest, state.starting_deadline_seconds):
            catch_up = [newest]
    elif state.missed_policy == MISSED_RUN_ALL:
        limit = state.missed_window_seconds
        if state.starting_deadline_seconds is not None:
            limit = min(limit, state.starting_deadline_seconds)
        catch_up = [tick for tick in candidates if _within(now - tick, limit)]
    sends.extend(Send(tick, TRIGGER_CATCH_UP) for tick in catch_up)
    sends.extend(Send(tick, TRIGGER_BEAT) for tick in on_time)
    chosen = set(catch_up)
    missed = tuple(tick for tick in candidates if tick not in chosen)
    return TickPlan(sends=tuple(sends), missed=missed, missed_more=more, advance_to=latest, next_tick=next_tick)


def _within(age: dt.timedelta, limit: float | None) -> bool:
    return limit is None or age.total_seconds() <= limit


def _next_tick(timing: Timing, now: dt.datetime) -> dt.datetime | None:
    try:
        return timing.next_after(now)
    except exceptions.InvalidCronExpression:  # a cron schedule with no tick for years
        return None


def seconds_until(instant: dt.datetime | None, now: dt.datetime, cap: float) -> float:
    """Seconds from ``now`` to ``instant``, at least 0 and at most ``cap`` (cap when None)."""
    if instant is None:
        return cap
    seconds = (instant - now).total_seconds()
    if math.isnan(seconds):
        return cap
    return max(0.0, min(cap, seconds))
