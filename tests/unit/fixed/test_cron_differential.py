"""scheduling.cron against cronsim, tick by tick (no database).

cronsim implements Debian cron's semantics in Python: Vixie's day-of-month/day-of-week rule (a
field starting with ``*`` is unrestricted) and Debian's rule at clock changes (a job whose minute
and hour fields do not start with ``*`` runs at the first occurrence of its wall time and at the
end of a gap; the others step through real time). Its DST code, read in the installed package
(``cronsim/cronsim.py``): for a five-field expression whose minute and hour do not start with
``*`` it iterates the naive wall clock and returns ``wall.replace(tzinfo=zone, fold=0)``, moved a
minute at a time past a gap; for the others it iterates aware datetimes, adding seconds through UTC.

Seeded random expressions and instants (most of them within a day and a half of a clock change,
in zones with odd ones) are compared over the next ``TICKS`` ticks. Every difference must be one
of the deliberate ones below, checked for what it is; anything else fails.

Deliberate differences
    1. Not generated, refused by one side: a seconds field, ``L``, ``W``, ``#`` and ``5/10`` (a step
       after a single value) are cronsim extensions Timekeeper refuses (Vixie cron refuses
       ``5/10`` too); descending ranges (``fri-mon``, ``50-10``, Celery's wrap-around) and
       nicknames are Timekeeper's and cronsim refuses them (nicknames are compared expanded).
    2. Gone since cronsim 2.9 (the version required): cronsim expanded ``a-a/n`` (a one-value
       range with a step) like ``a/n``, to the end of the field (``21-21/1`` was hours 21, 22, 23);
       it now takes it as the single value a, like Timekeeper, Vixie cron and Celery. Still not
       generated; the test below pins the agreement.
    3. ``second-pass-start``: a fixed-time schedule asked for its next tick from an instant in the
       second pass of a repeated hour. cronsim drops the fold of the start and can return the first
       occurrence of a later wall time of that hour, an instant before the start; Timekeeper's next
       tick is always after the start. cronsim's ticks at or before the start are left out.
    4. ``hour-step``: a wildcard schedule around a clock change that is not on a whole hour or skips
       midnight (Lord Howe's 30-minute change, Chatham's at 02:45, Santiago's and Tehran's at
       00:00). cronsim moves to the next hour by rounding down to hh:00 and adding real hours, so
       it lands on hh:30 or jumps over the hour the gap ends in (``* 3 * * *`` in Chatham on
       27 Sep 2026 misses 03:45-03:59). Debian cron runs wildcard jobs at every minute the clock
       shows, and so does Timekeeper: there Timekeeper's ticks must equal a minute-by-minute walk
       of the clock, matched with cronsim's own parsed fields.
    5. ``cronsim-loops``: the same rounding makes cronsim loop forever on Chatham's fall-back night:
       ``48 */3 * * *`` after 02:45 CHAST rounds down to 02:00, adds an hour (03:00 CHADT, before
       the change), adds 48 minutes (02:48 CHAST, after it), and again. The test stops cronsim after
       ``STEP_LIMIT`` moves of its clock in one tick and checks Timekeeper against the walk.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError

from scheduling import exceptions
from scheduling.fixed import cron

SEED = 20261025
CASES = 3000  # random expressions, each at its own instant
TICKS = 12  # ticks compared per case
STEP_LIMIT = 100_000  # moves of cronsim's clock in one tick before it counts as looping (it needs < 1,000)
MINUTE = timedelta(minutes=1)

# Half-hour DST (Lord Howe), :45 offsets and a change at 02:45 (Chatham), changes at midnight
# (Santiago, Havana, Tehran until 2022), southern hemisphere (Sao Paulo until 2019), no DST (Kolkata).
ZONES = {
    "Europe/Lisbon": (2026, 2027),
    "America/New_York": (2026, 2027),
    "Australia/Lord_Howe": (2021, 2026, 2027),
    "Asia/Tehran": (2021, 2022),
    "Pacific/Chatham": (2026, 2027),
    "America/Santiago": (2026, 2028),
    "America/Havana": (2026, 2027),
    "America/Sao_Paulo": (2018, 2019),
    "Europe/London": (2026,),
    "Asia/Kolkata": (2026,),
    "UTC": (2026,),
}
_BOUNDS = (
    (0, 59, ()),
    (0, 23, ()),
    (1, 31, ()),
    (1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    (0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)


@functools.cache
def transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    """The instants (to the minute) at which the zone changes its UTC offset during ``year``."""
    zone = ZoneInfo(zone_name)
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    while t.year == year:
        if t.astimezone(zone).utcoffset() != (t + timedelta(hours=1)).astimezone(zone).utcoffset():
            low, high = t, t + timedelta(hours=1)
            while high - low > MINUTE:
                middle = (low + (high - low) / 2).replace(second=0, microsecond=0)
                middle = middle if middle > low else low + MINUTE
                if middle.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset():
                    low = middle
                else:
                    high = middle
            found.append(high)
        t += timedelta(hours=1)
    return tuple(found)


def _atom(rng: random.Random, index: int) -> str:
    low, high, names = _BOUNDS[index]
    value = rng.randint(low, high)
    offset = 1 if index == 3 else 0
    if names and rng.random() < 0.2 and value - offset < len(names):
        name = names[value - offset]
        return name.upper() if rng.random() < 0.5 else name
    return str(value)


def _field(rng: random.Random, index: int) -> str:
    """A field both accept: *, */n, a, a-b (ascending), a-b/n with a < b, and lists of them."""
    low, high, _ = _BOUNDS[index]
    if rng.random() < 0.35:
        return "*"
    items = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        form = rng.choice(("*/n", "a", "a", "a-b", "a-b/n"))
        if form == "*/n":
            items.append(f"*/{rng.randint(1, 12 if index < 2 else high)}")
        elif form == "a":
            items.append(_atom(rng, index))
        else:
            first, last = sorted((rng.randint(low, high), rng.randint(low, high)))
            step = f"/{rng.randint(1, max(1, last - first))}" if form == "a-b/n" and first < last else ""
            items.append(f"{first}-{last}{step}")
    return ",".join(items)


def _typical(rng: random.Random) -> str:
    """An expression of the kinds people write."""
    m, m2, h, h2 = rng.randint(0, 59), rng.randint(0, 59), rng.randint(0, 23), rng.randint(0, 23)
    return rng.choice(
        (
            f"{m} {h} * * *",
            f"*/{rng.choice((1, 2, 5, 10, 15, 20, 30))} * * * *",
            f"{m} * * * *",
            f"{m} */{rng.randint(2, 6)} * * *",
            f"* {h} * * *",
            f"{min(m, m2)},{max(m, m2)} {min(h, h2)}-{max(h, h2)} * * *",
            f"{m} {h} * * {rng.randint(0, 7)}",
            f"{m} {h} {rng.randint(1, 28)} * *",
            f"0-59/{rng.choice((10, 15, 30))} {h} * * *",
            f"*/{rng.choice((5, 15))} {min(h, h2)}-{max(h, h2)} * * *",
            rng.choice(("@hourly", "@daily", "@weekly", "@monthly")),
        )
    )


def _instant(rng: random.Random, zone_name: str) -> datetime:
    changes = [c for year in ZONES[zone_name] for c in transitions(zone_name, year)]
    roll = rng.random()
    if changes and roll < 0.5:
        base = rng.choice(changes) + timedelta(seconds=rng.randint(-3 * 3600, 3 * 3600))
    elif changes and roll < 0.85:
        base = rng.choice(changes) + timedelta(seconds=rng.randint(-36 * 3600, 36 * 3600))
    else:
        base = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 10 * 365 * 86400))
    return base.replace(microsecond=0)


class CronsimLoops(Exception):
    """cronsim moved its clock ``STEP_LIMIT`` times without finding a tick (difference 5)."""


class BoundedCronSim(CronSim):
    """cronsim itself, counting the moves of its clock so that its endless loop ends."""

    steps = 0

    def tick(self, seconds: int = 1) -> None:
        self.steps += 1
        if self.steps > STEP_LIMIT:
            raise CronsimLoops
        super().tick(seconds)

    def __next__(self) -> datetime:
        self.steps = 0
        return super().__next__()


def _cronsim_ticks(expression: str, zone_name: str, start: datetime, count: int) -> list[datetime]:
    iterator = BoundedCronSim(cron.NICKNAMES.get(expression, expression), start.astimezone(ZoneInfo(zone_name)))
    return [next(iterator).astimezone(UTC) for _ in range(count)]


def _walk(expression: str, zone_name: str, start: datetime, end: datetime) -> list[datetime]:
    """Every minute in (start, end] at which the clock reads a matching wall time (cronsim's parsed fields)."""
    fields = CronSim(cron.NICKNAMES.get(expression, expression), datetime(2026, 1, 1, tzinfo=UTC))
    zone = ZoneInfo(zone_name)
    found = []
    t = start.replace(second=0) + MINUTE
    while t <= end:
        local = t.astimezone(zone)
        if (
            local.second == 0
            and local.minute in fields.minutes
            and local.hour in fields.hours
            and local.month in fields.months
            and fields.match_day(local.date())
        ):
            found.append(t)
        t += MINUTE
    return found


def _wildcard(expression: str) -> bool:
    minute, hour = cron.expand(expression).split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def _changes_within(zone_name: str, start: datetime, end: datetime) -> bool:
    return any(start - timedelta(days=1) <= c <= end for year in ZONES[zone_name] for c in transitions(zone_name, year))


def compare(expression: str, zone_name: str, start: datetime, count: int = TICKS) -> str:
    """``same``, ``refused`` or the name of the deliberate difference found; fails on any other."""
    try:
        schedule = cron.CronSchedule.parse(expression, zone_name)
    except exceptions.InvalidCronExpression as exc:  # only a day of the month none of the months has
        refusal = str(exc)
    else:
        refusal = ""
    if refusal:
        assert "never fires" in refusal, refusal
        with pytest.raises((CronSimError, StopIteration)):
            _cronsim_ticks(expression, zone_name, start, 1)
        return "refused"
    ours = schedule.next_n(start, count)
    outcome = "hour-step"
    try:
        theirs = _cronsim_ticks(expression, zone_name, start, count + 2)
    except CronsimLoops:
        theirs, outcome = [], "cronsim-loops"
    if ours == theirs[:count]:
        return "same"
    context = f"{expression!r} in {zone_name} after {start.isoformat()}:\n ours   {ours}\n cronsim {theirs}"
    if not _wildcard(expression) and start.astimezone(ZoneInfo(zone_name)).fold == 1:
        after_start = [tick for tick in theirs if tick > start]
        assert after_start[: len(ours)] == ours[: len(after_start)], context
        return "second-pass-start"
    assert _wildcard(expression), context
    assert _changes_within(zone_name, start, ours[-1]), context
    assert ours == _walk(expression, zone_name, start, ours[-1])[:count], context
    return outcome


def test_random_expressions_tick_like_cronsim_but_for_the_listed_differences() -> None:
    """3,000 seeded random expressions, mostly near clock changes in 11 zones: 12 ticks each equal cronsim's."""
    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    for _ in range(CASES):
        typical = rng.random() < 0.4
        expression = _typical(rng) if typical else " ".join(_field(rng, index) for index in range(5))
        zone_name = rng.choice(sorted(ZONES))
        outcomes[compare(expression, zone_name, _instant(rng, zone_name))] += 1
    print(f"\ncronsim differential: {CASES} expressions, {TICKS} ticks each: {dict(outcomes)}")
    assert sum(outcomes.values()) == CASES
    assert outcomes["same"] >= CASES * 0.95, outcomes
    assert outcomes["refused"] < CASES * 0.02, outcomes


@pytest.mark.parametrize(
    "expression",
    [
        "*/15 * * * *",
        "0 * * * *",
        "30 * * * *",
        "* 1 * * *",
        "0 */2 * * *",
        "30 1 * * *",
        "30 2 * * *",
        "0 0 * * *",
        "0,30 1-3 * * *",
        "0-59/15 1 * * *",
        "0 3 * * 7",
        "0 0 1-31 * 1",
        "@hourly",
        "@daily",
    ],
)
@pytest.mark.parametrize("zone_name", ["Europe/Lisbon", "America/New_York", "Australia/Lord_Howe", "Asia/Tehran"])
def test_common_expressions_through_every_clock_change_tick_like_cronsim(expression: str, zone_name: str) -> None:
    """Common expressions from 3 h before each clock change of the zone: 40 ticks equal cronsim's (or a listed case)."""
    outcomes = Counter(
        compare(expression, zone_name, change - timedelta(hours=3), 40)
        for year in ZONES[zone_name]
        for change in transitions(zone_name, year)
    )
    assert outcomes.keys() <= {"same", "hour-step", "cronsim-loops"}, outcomes
    if zone_name in ("Europe/Lisbon", "America/New_York"):  # whole-hour changes away from midnight
        assert set(outcomes) == {"same"}, outcomes


def test_quarter_hours_at_lisbon_fall_back_match_cronsim_and_debian() -> None:
    """*/15 * * * * on 25 Oct 2026 in Lisbon: cronsim and Timekeeper fire every 15 minutes through both 01:xx hours."""
    start = datetime(2026, 10, 24, 23, 50, tzinfo=UTC)
    ours = cron.CronSchedule.parse("*/15 * * * *", "Europe/Lisbon").next_n(start, 10)
    assert ours == _cronsim_ticks("*/15 * * * *", "Europe/Lisbon", start, 10)
    assert {b - a for a, b in itertools.pairwise(ours)} == {timedelta(minutes=15)}


@pytest.mark.parametrize(
    ("expression", "zone_name", "start", "outcome"),
    [
        # 3: from 01:10 WET (second pass) cronsim returns 01:30 WEST, 40 minutes before the start.
        ("30 1 * * *", "Europe/Lisbon", datetime(2026, 10, 25, 1, 10, tzinfo=UTC), "second-pass-start"),
        # 4: cronsim jumps from 02:00 CHAST over the gap to 04:00 CHADT, missing 03:45-03:59.
        ("* 3 * * *", "Pacific/Chatham", datetime(2026, 9, 26, 10, 26, tzinfo=UTC), "hour-step"),
        # 4: on Lord Howe's spring-forward day cronsim reaches 18:32 from 01:00 + 17 real hours.
        ("*/8 18 * * *", "Australia/Lord_Howe", datetime(2021, 10, 2, 15, 18, tzinfo=UTC), "hour-step"),
        # 4: from Santiago's missing midnight cronsim adds real hours and misses 01:00-01:59.
        ("* 1-3 3-16/9 * *", "America/Santiago", datetime(2028, 8, 26, 1, 46, tzinfo=UTC), "hour-step"),
        # 5: cronsim loops between 03:00 CHADT and 02:48 CHAST.
        ("48 */3 * * *", "Pacific/Chatham", datetime(2026, 4, 4, 14, 13, 44, tzinfo=UTC), "cronsim-loops"),
        ("0 3 * * 7", "Europe/Lisbon", datetime(2026, 3, 28, tzinfo=UTC), "same"),
    ],
)
def test_each_listed_difference_happens_where_described(
    expression: str, zone_name: str, start: datetime, outcome: str
) -> None:
    """Each deliberate difference of the module docstring shows up on its example, and Timekeeper's side holds."""
    assert compare(expression, zone_name, start) == outcome


def test_cronsim_and_timekeeper_read_a_one_value_range_with_a_step_as_that_value() -> None:
    """Former difference 2: 21-21/1 is 21:00 only, for Timekeeper and for cronsim >= 2.9 alike."""
    start = datetime(2026, 6, 1, 20, tzinfo=UTC)
    ours = cron.CronSchedule.parse("0 21-21/1 * * *", "UTC").next_n(start, 3)
    assert [t.hour for t in ours] == [21, 21, 21]
    assert [t.day for t in ours] == [1, 2, 3]
    assert _cronsim_ticks("0 21-21/1 * * *", "UTC", start, 3) == ours
