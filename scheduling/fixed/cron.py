"""Fixed-time schedule ticks: cron expressions and intervals, correct across DST changes.

Pure Python: no database, no Django settings. Every instant returned is an aware UTC datetime.

Cron expressions
    Five fields, checked and expanded to value sets by ``scheduling.fixed.cron_fields`` (its
    docstring has the grammar and the Vixie rule for day of month and day of week); ``expand`` and
    ``NICKNAMES`` are re-exported here. This module places a parsed expression's ticks on the wall
    clock of a time zone.

DST semantics
    A schedule runs on the wall clock of its time zone, with Debian cron's rule at clock changes
    (``cron.c``: "fixed-time" jobs versus "wildcard" jobs, told apart by ``MIN_STAR``/``HR_STAR``,
    i.e. whether the minute or the hour field starts with ``*``):
    * **Fixed time** (neither the minute nor the hour field starts with ``*``: ``30 1 * * *``,
      ``0,30 9-17 * * *``, ``@daily``): each matching wall time fires once. Clocks go back (the
      wall time happens twice): it fires at its first occurrence only, so ``30 1 * * *`` runs once
      on Lisbon's fall-back night. Clocks go forward (the wall time does not exist): with
      ``dst_gap="shift"`` (the default, Debian's) it fires at the instant the gap ends, the first
      instant the clock reads that wall time or later (01:30 on 2026-03-29 in Europe/Lisbon fires
      at 02:00 WEST = 01:00 UTC); with ``dst_gap="skip"`` it does not fire that day. Several wall
      times that shift to the same instant fire once.
    * **Wildcard** (the minute or the hour field starts with ``*``: ``*/15 * * * *``,
      ``0 * * * *``, ``@hourly``, ``5 */2 * * *``): the schedule keeps its real-time cadence. It
      fires at every instant at which the clock reads a matching wall time: twice for a wall time
      of the repeated hour (``*/15 * * * *`` in Lisbon on 25 Oct 2026 fires at 01:00..01:45 WEST
      and again at 01:00..01:45 WET, every 15 minutes), never for one skipped by a gap
      (``dst_gap`` does not apply).
    ``0-59/15`` and ``0,15,30,45`` are fixed-time fields (they do not start with ``*``), as in
    Debian cron and cronsim. On a day without a clock change both kinds agree.

Intervals
    ``interval_tick`` and ``interval_next_after`` place ticks on a grid ``anchor + k * every``
    (anchor defaults to the Unix epoch) with integer microsecond arithmetic, so every replica
    computes the same tick for the same moment.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cron_descriptor import (
    ExpressionDescriptor,
    FormatException,
    MissingFieldException,
    Options,
    WrongArgumentException,
)

from scheduling.core import exceptions
from scheduling.fixed import cron_fields

DST_GAP_SHIFT: Final = "shift"
DST_GAP_SKIP: Final = "skip"
DST_GAP_CHOICES: Final = (DST_GAP_SHIFT, DST_GAP_SKIP)

# Re-exported: callers use cron.expand and cron.NICKNAMES.
expand = cron_fields.expand
NICKNAMES: Final = cron_fields.NICKNAMES

# Longest stretch a search walks without finding a tick. With a day of the month and a day of the
# week that must both match (Vixie's rule when one starts with '*'), ticks can be decades apart:
# 13 June on a Sunday 11 years (2038, 2049), 29 February on a Sunday 40 (across 2100). cronsim
# gives up after 50 years as well.
SEARCH_LIMIT_DAYS: Final = 50 * 366

# min_interval_seconds() looks at the ticks in this many days from its reference date...
MIN_INTERVAL_WINDOW_DAYS: Final = 366
# ... which is fixed, so the answer does not depend on when it is asked.
MIN_INTERVAL_REFERENCE: Final = datetime(2026, 1, 1, tzinfo=UTC)

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# How many clock-change days' ticks a schedule keeps computed (each is up to 1,440 instants).
_CHANGE_DAYS_CACHED: Final = 8

_ONE_MICROSECOND: Final = timedelta(microseconds=1)


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise exceptions.UnknownTimeZone(f"A time zone name is required, got {name!r}.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # ValueError: malformed key (absolute, '..'); OSError: a directory such as 'Europe'.
        raise exceptions.UnknownTimeZone(f"The tz database has no time zone {name!r}.") from exc


def _as_utc(instant: datetime, what: str = "instant") -> datetime:
    if not isinstance(instant, datetime) or instant.utcoffset() is None:
        raise exceptions.InvalidSchedule(f"The {what} must be a timezone-aware datetime, got {instant!r}.")
    return instant.astimezone(UTC)


@dataclass(frozen=True)
class CronSchedule:
    """A cron expression (or nickname) on the wall clock of a time zone.

    Construction validates everything: ``InvalidCronExpression`` for the expression,
    ``UnknownTimeZone`` for the zone, ``InvalidPolicy`` for a ``dst_gap`` other than
    ``"shift"``/``"skip"``. See the module docstring for the DST semantics.
    """

    expression: str
    timezone: str
    dst_gap: str = DST_GAP_SHIFT
    _expanded: str = field(init=False, repr=False, compare=False)
    _fields: cron_fields.Fields = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _minutes_of_day: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _change_days: dict[date, tuple[datetime, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        expanded, fields = cron_fields.parse(self.expression)
        if self.dst_gap not in DST_GAP_CHOICES:
            raise exceptions.InvalidPolicy(f"dst_gap must be 'shift' or 'skip', not {self.dst_gap!r}.")
        object.__setattr__(self, "_expanded", expanded)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_zone", _zone(self.timezone))
        object.__setattr__(self, "_minutes_of_day", fields.minutes_of_day())
        object.__setattr__(self, "_change_days", {})

    @classmethod
    def parse(cls, expr: str, tz: str, dst_gap: str = DST_GAP_SHIFT) -> CronSchedule:
        """Validate and build a schedule; whitespace in ``expr`` is normalised."""
        if isinstance(expr, str):
            expr = " ".join(expr.split())
        return cls(expression=expr, timezone=tz, dst_gap=dst_gap)

    @property
    def expanded(self) -> str:
        """The five-field form of the expression (nicknames expanded)."""
        return self._expanded

    @property
    def nickname(self) -> str | None:
        """The nickname the schedule was declared with (``@daily`` ...), if any."""
        return self.expression.lower() if self.expression.startswith("@") else None

    # --- public queries ---------------------------------------------------------------------

    def next_after(self, instant: datetime) -> datetime:
        """The first tick strictly after ``instant`` (aware, any zone), in UTC."""
        return next(self._ticks_after(_as_utc(instant)))

    def ticks_between(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """The ticks ``t`` with ``start < t <= end``, in order, in UTC."""
        after, until = _as_utc(start, "start"), _as_utc(end, "end")
        if until <= after:
            return iter(())
        return itertools.takewhile(lambda tick: tick <= until, self._ticks_after(after))

    def next_n(self, after: datetime, n: int) -> list[datetime]:
        """The first ``n`` ticks strictly after ``after``, for previews."""
        if n <= 0:
            return []
        return list(itertools.islice(self._ticks_after(_as_utc(after, "after")), n))

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The latest tick at or before ``instant``, or None if none within the search limit."""
        at = _as_utc(instant)
        local_day = at.astimezone(self._zone).date()
        try:
            # A tick of a later local day can come before `instant` when `instant` is in the second
            # pass of a repeated interval that spans midnight, so start a day ahead.
            start = local_day + timedelta(days=1)
        except OverflowError:
            start = local_day
        best: datetime | None = None
        for day in self._matching_days(start, forward=False):
            ticks = self._day_ticks(day)
            index = bisect.bisect_right(ticks, at) - 1
            if index >= 0 and (best is None or ticks[index] > best):
                best = ticks[index]
            if best is not None and best >= self._day_end(day, days_before=1):
                return best  # the earlier days' ticks all come before it
        return best

    def min_interval_seconds(self, reference: datetime | None = None) -> float:
        """The shortest gap between consecutive ticks in the year after ``reference``.

        ``reference`` defaults to ``MIN_INTERVAL_REFERENCE`` (fixed, so the answer is stable); the
        window grows past a year until it holds two ticks (``0 0 29 2 *``). DST days count, so
        ``0 3 * * *`` in a DST zone gives 23 hours. ``math.inf`` if fewer than two ticks are found.
        Days without a clock change are not resolved tick by tick: their gaps are the wall-clock gaps.
        """
        ref = _as_utc(reference if reference is not None else MIN_INTERVAL_REFERENCE, "reference")
        first_day = ref.astimezone(self._zone).date()
        window_end = first_day + timedelta(days=MIN_INTERVAL_WINDOW_DAYS)
        wall_gap = min((b - a for a, b in itertools.pairwise(self._minutes_of_day)), default=None)
        best = math.inf
        count = 0
        # Every tick of a clock-change day, the first and last of other days: consecutive ones of
        # these are either consecutive ticks or further apart than the wall-clock gap of a day.
        marks: set[datetime] = set()
        for day in self._matching_days(first_day, forward=True):
            if day >= window_end and count >= 2:
                break
            ticks = self._day_ticks(day)
            count += len(ticks)
            if isinstance(ticks, _PlainDay):
                if len(ticks) >= 2 and wall_gap is not None:
                    best = min(best, wall_gap * 60.0)
                marks.update((ticks[0], ticks[len(ticks) - 1]))
            else:
                marks.update(ticks)
        ordered = sorted(marks)
        best = min([best, *((b - a).total_seconds() for a, b in itertools.pairwise(ordered))])
        return best if len(ordered) >= 2 else math.inf

    def describe(self) -> str:
        """A readable English description, e.g. ``At 03:00 AM (Europe/Lisbon)``."""
        options = Options()
        options.day_of_week_start_index_zero = True
        try:
            text = ExpressionDescriptor(self._expanded, options).get_description()
        except (FormatException, MissingFieldException, WrongArgumentException):
            text = f"Cron {self._expanded!r}"
        notes = [self.timezone]
        if self._fields.dom_restricted and self._fields.dow_restricted:
            notes.append("on days matching either the day of the month or the day of the week")
        if self._fields.wildcard_time:
            if self._zone_changes_offset():
                notes.append("at clock changes it keeps its real-time cadence: a repeated hour runs twice")
        elif self.dst_gap == DST_GAP_SKIP:
            notes.append("times skipped by a clock change do not run")
        described = f"{text} ({'; '.join(notes)})"
        if self.nickname is not None:
            described = f"{self.nickname}: {described}"
        return described

    # --- machinery ----------------------------------------------------------------------------

    def _ticks_after(self, after: datetime) -> Iterator[datetime]:
        """Every tick strictly after ``after`` (UTC), ascending; raises if one never comes.

        Days are visited in order; a day's ticks are ascending, but at a repeated interval that
        spans midnight a day's second-pass ticks come after the next day's first ones, so ticks
        wait in a heap until no later day can have an earlier one (``_day_start``).
        """
        local_day = after.astimezone(self._zone).date()
        try:
            start = local_day - timedelta(days=1)  # its second-pass ticks may still be ahead
        except OverflowError:
            start = local_day
        heap: list[tuple[datetime, int, _DayTicks, int]] = []
        order = itertools.count()
        previous: datetime | None = None
        for day in self._matching_days(start, forward=True):
            ticks = self._day_ticks(day)
            index = bisect.bisect_right(ticks, after)
            if index < len(ticks):
                heapq.heappush(heap, (ticks[index], next(order), ticks, index))
            try:
                boundary: datetime | None = self._day_start(day + timedelta(days=1))
            except OverflowError:
                boundary = None
            while heap and (boundary is None or heap[0][0] < boundary):
                tick, _, source, index = heapq.heappop(heap)
                if index + 1 < len(source):
                    heapq.heappush(heap, (source[index + 1], next(order), source, index + 1))
                if tick != previous:  # several gap wall times may shift to one instant
                    previous = tick
                    yield tick
        while heap:
            tick, _, source, index = heapq.heappop(heap)
            if index + 1 < len(source):
                heapq.heappush(heap, (source[index + 1], next(order), source, index + 1))
            if tick != previous:
                previous = tick
                yield tick
        raise exceptions.InvalidCronExpression(
            f"Cron expression {self.expression!r} never fires in {self.timezone} within "
            f"{SEARCH_LIMIT_DAYS // 366} years after {(previous or after).isoformat()}."
        )

    def _matching_days(self, start: date, *, forward: bool) -> Iterator[date]:
        """Local days the expression runs on, from ``start`` on (or back), skipping whole months.

        Stops after ``SEARCH_LIMIT_DAYS`` days without a match or at the end of the calendar.
        """
        months = self._fields.months
        day = origin = start
        try:
            while abs((day - origin).days) <= SEARCH_LIMIT_DAYS:
                if day.month not in months:
                    if forward:
                        day = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
                    else:
                        day = day.replace(day=1) - timedelta(days=1)
                    continue
                if self._fields.day_matches(day):
                    yield day
                    origin = day
                day += timedelta(days=1 if forward else -1)
        except OverflowError:
            return

    def _wall(self, day: date, index: int) -> datetime:
        minute = self._minutes_of_day[index]
        return datetime.combine(day, time(minute // 60, minute % 60))

    def _day_ticks(self, day: date) -> _DayTicks:
        """The ticks of a matching local day (those whose wall time is on that day), ascending."""
        if not self._has_clock_change(day):
            return _PlainDay(self._zone, day, self._minutes_of_day)
        ticks = self._change_days.get(day)
        if ticks is None:
            ticks = self._clock_change_day_ticks(day)
            if len(self._change_days) >= _CHANGE_DAYS_CACHED:
                self._change_days.clear()
            self._change_days[day] = ticks
        return ticks

    def _clock_change_day_ticks(self, day: date) -> tuple[datetime, ...]:
        """A clock-change day's ticks, wall time by wall time (see the module docstring)."""
        found: set[datetime] = set()
        for index in range(len(self._minutes_of_day)):
            wall = self._wall(day, index)
            first = wall.replace(tzinfo=self._zone).astimezone(UTC)  # fold=0: first occurrence if repeated
            if first.astimezone(self._zone).replace(tzinfo=None) == wall:
                found.add(first)
                if self._fields.wildcard_time:  # the second occurrence too (the same instant if none)
                    found.add(wall.replace(tzinfo=self._zone, fold=1).astimezone(UTC))
            elif not self._fields.wildcard_time and self.dst_gap == DST_GAP_SHIFT:
                found.add(self._gap_end(wall))
        return tuple(sorted(found))

    def _reading(self, wall: datetime, *, last: bool) -> datetime:
        """The first (or last) instant the clock reads ``wall``; the gap's end if it never does."""
        instant = wall.replace(tzinfo=self._zone, fold=1 if last else 0).astimezone(UTC)
        if instant.astimezone(self._zone).replace(tzinfo=None) == wall:
            return instant
        return self._gap_end(wall)

    def _day_start(self, day: date) -> datetime:
        """No tick of ``day`` or a later day comes before this instant (the clock reaching 00:00)."""
        return self._reading(datetime.combine(day, time()), last=False)

    def _day_end(self, day: date, days_before: int = 0) -> datetime:
        """No tick of the day ``days_before`` days before ``day``, or an earlier one, comes after this."""
        try:
            following = day + timedelta(days=1 - days_before)
        except OverflowError:
            return datetime.max.replace(tzinfo=UTC)
        return self._reading(datetime.combine(following, time()), last=True)

    def _gap_end(self, wall: datetime) -> datetime:
        """The first instant at which the local clock reads ``wall`` or later (``wall`` is in a gap)."""
        candidates = sorted(
            (wall.replace(tzinfo=self._zone, fold=fold).astimezone(UTC) for fold in (0, 1)),
        )
        low, high = math.floor(candidates[0].timestamp()), math.ceil(candidates[1].timestamp())

        def reached(seconds: int) -> bool:
            local = datetime.fromtimestamp(seconds, UTC).astimezone(self._zone)
            return local.replace(tzinfo=None) >= wall

        if reached(low) or not reached(high):  # not a simple gap; the later reading will do
            return datetime.fromtimestamp(high, UTC)
        while high - low > 1:  # invariant: not reached at low, reached at high
            middle = (low + high) // 2
            if reached(middle):
                high = middle
            else:
                low = middle
        return datetime.fromtimestamp(high, UTC)

    def _has_clock_change(self, day: date) -> bool:
        """Whether the UTC offset changes during ``day`` or at either of its midnights."""
        offsets = set()
        for midnight in (day, day + timedelta(days=1)):
            for fold in (0, 1):
                local = datetime.combine(midnight, time(), tzinfo=self._zone).replace(fold=fold)
                offsets.add(local.utcoffset())
        return len(offsets) > 1

    def _zone_changes_offset(self) -> bool:
        """Whether the zone's UTC offset differs between January and July (it has DST)."""
        year = MIN_INTERVAL_REFERENCE.year
        return len({datetime(year, month, 1, tzinfo=self._zone).utcoffset() for month in (1, 7)}) > 1


class _PlainDay:
    """The ticks of a day without a clock change, computed on demand (bisect reads a handful)."""

    __slots__ = ("_day", "_minutes", "_zone")

    def __init__(self, zone: ZoneInfo, day: date, minutes: tuple[int, ...]) -> None:
        self._zone, self._day, self._minutes = zone, day, minutes

    def __len__(self) -> int:
        return len(self._minutes)

    def __getitem__(self, index: int) -> datetime:
        minute = self._minutes[index]
        wall = datetime.combine(self._day, time(minute // 60, minute % 60), tzinfo=self._zone)
        return wall.astimezone(UTC)


_DayTicks = _PlainDay | tuple[datetime, ...]


def _interval_micros(every_seconds: float) -> int:
    if isinstance(every_seconds, bool) or not isinstance(every_seconds, int | float):
        raise exceptions.InvalidSchedule(f"An interval must be a number of seconds, got {every_seconds!r}.")
    if not math.isfinite(every_seconds) or every_seconds <= 0:
        raise exceptions.InvalidSchedule(f"An interval must be a positive number of seconds, got {every_seconds!r}.")
    micros = round(every_seconds * 1_000_000)
    if micros < 1:
        raise exceptions.InvalidSchedule(f"An interval must be at least 1 microsecond, got {every_seconds!r}.")
    return micros


def interval_tick(now: datetime, every_seconds: float, anchor: datetime | None = None) -> datetime:
    """The latest tick at or before ``now`` of the grid ``anchor + k * every_seconds``, in UTC.

    ``anchor`` defaults to the Unix epoch; the grid extends before the anchor too. Integer
    microsecond arithmetic makes every replica compute the same tick for the same moment.
    """
    at = _as_utc(now, "now")
    origin = _as_utc(anchor if anchor is not None else EPOCH, "anchor")
    every = _interval_micros(every_seconds)
    elapsed = (at - origin) // _ONE_MICROSECOND
    return origin + timedelta(microseconds=(elapsed // every) * every)


def interval_next_after(instant: datetime, every_seconds: float, anchor: datetime | None = None) -> datetime:
    """The first tick strictly after ``instant`` of the grid ``anchor + k * every_seconds``, in UTC."""
    every = _interval_micros(every_seconds)
    return interval_tick(instant, every_seconds, anchor) + timedelta(microseconds=every)
