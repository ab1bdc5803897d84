"""When a recurrence's occurrences fall: its cron expression (or interval) on its own zone.

Pure Python on the fixed-time schedules' cron engine (``scheduling.fixed.cron``), so a
recurrence follows exactly the same Debian rules at clock changes (``dst_gap`` applies to fixed
wall times the clock skips; a repeated wall time runs once). ``following()`` decides the next
occurrence after the latest one, with the missed policy: an instant older than
``SCHEDULING_RECURRENCE_LATE_SECONDS`` is missed, and ``skip`` plans the first one after now while
``run_once`` plans the latest missed one, due now, and then the schedule again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Collection
from typing import Protocol

from scheduling.core import exceptions, validation
from scheduling.fixed import cron

MISSED_SKIP = "skip"
MISSED_RUN_ONCE = "run_once"
MISSED_CHOICES = (MISSED_SKIP, MISSED_RUN_ONCE)
ONE_MICROSECOND = dt.timedelta(microseconds=1)
RULE_CACHE_SIZE = 4096  # distinct (expression, zone, dst_gap) / interval rules kept parsed


class Schedule(Protocol):
    def next_after(self, instant: dt.datetime) -> dt.datetime: ...

    def latest_at_or_before(self, instant: dt.datetime) -> dt.datetime | None: ...


@dataclasses.dataclass(frozen=True)
class Interval:
    """An ``every=`` grid ``anchor + k * every_seconds``."""

    every_seconds: float
    anchor: dt.datetime

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        return cron.interval_next_after(instant, self.every_seconds, self.anchor)

    def latest_at_or_before(self, instant: dt.datetime) -> dt.datetime | None:
        return cron.interval_tick(instant, self.every_seconds, self.anchor)


@functools.lru_cache(maxsize=RULE_CACHE_SIZE)
def _cron(expression: str, timezone: str, dst_gap: str) -> cron.CronSchedule:
    return cron.CronSchedule.parse(expression, timezone, dst_gap)


def schedule_for(
    expression: str, every_seconds: float | None, timezone: str, dst_gap: str, anchor: dt.datetime
) -> Schedule:
    """The schedule of a rule (validated: ``InvalidCronExpression``, ``UnknownTimeZone``, ``InvalidPolicy``)."""
    if every_seconds is not None:
        cron._zone(timezone)  # the zone is validated (and shown) for interval rules too
        cron.interval_next_after(anchor, every_seconds, anchor)  # validates the interval
        return Interval(float(every_seconds), anchor)
    return _cron(expression, timezone, dst_gap)


def shortest_gap_seconds(schedule: Schedule) -> float:
    """The shortest time between two occurrences: ``every`` seconds, or a cron's over a year (DST days included)."""
    if isinstance(schedule, Interval):
        return schedule.every_seconds
    assert isinstance(schedule, cron.CronSchedule)
    return schedule.min_interval_seconds()


BOUNDED = frozenset({"starts_at", "ends_at", "every"})  # check_rule: the arguments whose limits apply


def check_rule(
    cron_expression: str | None,
    every: float | int | dt.timedelta | None,
    starts_at: dt.datetime | None,
    ends_at: dt.datetime | None,
    missed: str,
    *,
    bounded: Collection[str] = BOUNDED,
) -> tuple[str, float | None]:
    """Validate the parts ``schedule_for`` does not see; returns (expression, every_seconds).

    The window of ``starts_at`` / ``ends_at`` and the maximum of ``every`` apply to the names in
    ``bounded`` only: ``change_recurrence`` passes the arguments its caller gave, so values stored
    before these limits existed (an ``ends_at`` beyond ten years) do not block an unrelated change.
    """
    if (cron_expression is None) == (every is None):
        raise exceptions.InvalidRecurrence("Give exactly one of cron= and every=.")
    for name, value in (("starts_at", starts_at), ("ends_at", ends_at)):
        if value is not None and (not isinstance(value, dt.datetime) or value.utcoffset() is None):
            raise exceptions.InvalidSchedule(f"{name} must be a timezone-aware datetime, got {value!r}.")
        if (
            value is not None and name in bounded
        ):  # the jobs' window (2000-01-01 to ten years ahead): past it the arithmetic overflows
            try:
                validation.check_due_at(value)
            except exceptions.InvalidSchedule as exc:
                raise exceptions.InvalidSchedule(str(exc).replace("due_at", name, 1)) from None
    if starts_at is not None and ends_at is not None and ends_at <= starts_at:
        raise exceptions.InvalidRecurrence("ends_at must be after starts_at.")
    if missed not in MISSED_CHOICES:
        raise exceptions.InvalidPolicy(f"missed must be one of {', '.join(MISSED_CHOICES)}, not {missed!r}.")
    if every is None:
        if not isinstance(cron_expression, str) or not cron_expression.strip():
            raise exceptions.InvalidCronExpression(f"A cron expression is required, got {cron_expression!r}.")
        return " ".join(cron_expression.split()), None
    seconds = every.total_seconds() if isinstance(every, dt.timedelta) else every
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 1:
        raise exceptions.InvalidRecurrence(f"every must be at least 1 second, got {every!r}.")
    if "every" in bounded and not seconds <= validation.MAX_DELAY_SECONDS:  # also NaN and infinity
        raise exceptions.InvalidRecurrence(f"every must be at most {validation.MAX_DELAY_SECONDS} seconds (ten years).")
    return "", float(seconds)


@dataclasses.dataclass(frozen=True)
class Occurrence:
    at: dt.datetime  # the scheduled instant (the unique record)
    due_at: dt.datetime  # when it runs: the instant, or now for a missed one run once


def following(
    schedule: Schedule,
    after: dt.datetime,
    *,
    now: dt.datetime,
    missed: str,
    late_seconds: float,
    ends_at: dt.datetime | None = None,
    starts_at: dt.datetime | None = None,
    inclusive: bool = False,
) -> Occurrence | None:
    """The occurrence after ``after`` (at or after it when ``inclusive``), with the missed policy; None past the end.

    Never before ``starts_at`` (a start moved later while an occurrence ran or the recurrence was
    paused: the planner and resume planned from the last run, days before it). ``run_once`` runs the
    latest instant missed up to ``ends_at`` when the end passed while nothing planned (it looked up
    to now, found that instant past the end and ran none).
    """
    if starts_at is not None and after < starts_at:
        after, inclusive = starts_at, True
    candidate = schedule.next_after(after - ONE_MICROSECOND if inclusive else after)
    if candidate < now - dt.timedelta(seconds=late_seconds):
        if missed == MISSED_RUN_ONCE:
            latest = schedule.latest_at_or_before(now if ends_at is None else min(now, ends_at))
            if latest is not None and latest >= candidate:
                return Occurrence(at=latest, due_at=now)
        candidate = schedule.next_after(now)
    if ends_at is not None and candidate > ends_at:
        return None
    return Occurrence(at=candidate, due_at=candidate)


def first(
    schedule: Schedule, *, now: dt.datetime, starts_at: dt.datetime | None, ends_at: dt.datetime | None
) -> Occurrence | None:
    """A new (or changed) rule's first occurrence: at or after its start, strictly after now."""
    if starts_at is not None and starts_at > now:
        at = schedule.next_after(starts_at - ONE_MICROSECOND)
    else:
        at = schedule.next_after(now)
    if ends_at is not None and at > ends_at:
        return None
    return Occurrence(at=at, due_at=at)


def upcoming(schedule: Schedule, after: dt.datetime, n: int, *, ends_at: dt.datetime | None) -> list[dt.datetime]:
    """Up to ``n`` instants from ``after`` (inclusive), stopping at the end."""
    instants: list[dt.datetime] = []
    at = after - ONE_MICROSECOND
    while len(instants) < n:
        at = schedule.next_after(at)
        if ends_at is not None and at > ends_at:
            break
        instants.append(at)
    return instants
