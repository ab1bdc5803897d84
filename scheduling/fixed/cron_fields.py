"""Cron expressions: the grammar of the five fields, checked strictly and expanded to value sets.

No database, no Django settings. ``scheduling.fixed.cron`` turns the value sets into
ticks on a time zone's wall clock (and re-exports ``expand`` and ``NICKNAMES``).

Five fields, ``minute hour day-of-month month day-of-week``: ``*``, numbers, ranges ``a-b``,
steps ``*/n`` and ``a-b/n``, lists ``a,b``. Month names (``jan``..``dec``) are accepted in the
month field and day names (``sun``..``sat``) in the day-of-week field, three letters, any case.
Day of week 0 and 7 both mean Sunday, in ranges too (``1-7`` is Monday to Sunday, ``0-7/2`` is
Sunday, Tuesday, Thursday, Saturday, as in Vixie cron). A descending range wraps around, as in
Celery: ``fri-sun`` is Friday, Saturday and Sunday, ``fri-mon/2`` Friday and Sunday (the week
has one Sunday), ``50-10`` in the minute field is minutes 50..59 and 0..10. A step needs ``*`` or
a range in front of it (``5/10`` is refused). Nicknames: ``@yearly``/``@annually``,
``@monthly``, ``@weekly``, ``@daily``/``@midnight``, ``@hourly``; ``@reboot`` has no time and is
refused. Seconds fields and ``@every`` are refused: intervals are ``every=`` schedules.

``expand()`` gives the form that is written into django-celery-beat's ``CrontabSchedule``, and
Celery's ``crontab`` reads every field of it as the same values: a day-of-week field naming 7
(which Celery refuses) is rewritten as the list of its days (``1-7`` -> ``0-6``). A field is
also refused when it is longer than the column that stores it, and a whole expression when it is
longer than ``MAX_LENGTH`` (``scheduling.models.MAX_CRON_LENGTH``, the recurrence's column).

Day of month and day of week follow the Vixie cron rule (``entry.c`` sets ``DOM_STAR`` and
``DOW_STAR`` from the field's first character): a field that starts with ``*`` (``*``, ``*/2``)
is unrestricted, any other (``1-31``, ``0-6``, ``mon-fri``) is restricted, whatever values it
covers. When both are restricted a day matches if either matches; otherwise both must match.
So ``0 0 1-31 * 1`` runs every day, ``0 0 */2 * 1`` on Mondays that are odd days of the month,
as in Vixie and Debian cron and cronsim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Final

from scheduling.core import exceptions
from scheduling.models import recurring as recurring_models

NICKNAMES: Final[dict[str, str]] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

MONTH_NAMES: Final = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAY_NAMES: Final = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# Longest month lengths, Feb 29 included: a day-of-month no listed month reaches never fires.
_MONTH_DAYS: Final = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}

_PART = re.compile(
    r"(?:\*|(?P<low>[0-9]+|[a-z]+)(?:-(?P<high>[0-9]+|[a-z]+))?)(?:/(?P<step>[0-9]+))?",
    re.ASCII | re.IGNORECASE,
)
# A whole expression longer than this is refused (the recurrence's column holds this many).
MAX_LENGTH: Final = recurring_models.MAX_CRON_LENGTH
# A number with more significant digits than this is out of every range (and never reaches int()).
_MAX_DIGITS: Final = 9


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    # The length of django-celery-beat's CrontabSchedule column that stores the field.
    max_length: int = 64


_MINUTE = _FieldSpec("minute", 0, 59, max_length=240)
_HOUR = _FieldSpec("hour", 0, 23, max_length=96)
_DAY_OF_MONTH = _FieldSpec("day-of-month", 1, 31, max_length=124)
_MONTH = _FieldSpec("month", 1, 12, MONTH_NAMES)
# 7 is accepted here and folded onto 0 (Sunday) after parsing.
_DAY_OF_WEEK = _FieldSpec("day-of-week", 0, 7, DAY_NAMES)
_FIELD_SPECS: Final = (_MINUTE, _HOUR, _DAY_OF_MONTH, _MONTH, _DAY_OF_WEEK)


@dataclass(frozen=True)
class Fields:
    """The value sets of a parsed expression; day of week counts from Sunday = 0."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]
    dom_restricted: bool  # the day-of-month field does not start with '*' (Vixie's DOM_STAR unset)
    dow_restricted: bool  # the day-of-week field does not start with '*' (Vixie's DOW_STAR unset)
    wildcard_time: bool  # the minute or the hour field starts with '*' (Debian's MIN_STAR|HR_STAR)

    def day_matches(self, day: date) -> bool:
        """Whether ``day`` is a day the expression runs on (Vixie rule for dom/dow)."""
        if day.month not in self.months:
            return False
        dom = day.day in self.days_of_month
        dow = day.isoweekday() % 7 in self.days_of_week
        if self.dom_restricted and self.dow_restricted:
            return dom or dow
        return dom and dow  # an unrestricted field holds every value

    def minutes_of_day(self) -> tuple[int, ...]:
        """Matching wall times of a day, as minutes after midnight, ascending."""
        return tuple(sorted(h * 60 + m for h in self.hours for m in self.minutes))


def expand(expr: str) -> str:
    """Return the five-field form of a cron expression or nickname, validated.

    Raises ``InvalidCronExpression`` saying what is wrong: unknown nickname, wrong number of
    fields, a value out of range, a name where none is allowed, garbage, or a day that never comes.
    """
    return parse(expr)[0]


def parse(expr: str) -> tuple[str, Fields]:
    """The five-field form of ``expr`` (as ``expand`` returns it) and its value sets; raises as ``expand``."""
    if not isinstance(expr, str):
        raise exceptions.InvalidCronExpression(f"A cron expression must be a string, not {type(expr).__name__}.")
    text = expr.strip()
    if not text:
        raise exceptions.InvalidCronExpression("The cron expression is empty.")
    if len(text) > MAX_LENGTH:
        raise exceptions.InvalidCronExpression(
            f"The cron expression is {len(text)} characters long; at most {MAX_LENGTH} are stored."
        )
    if text.startswith("@"):
        nickname = text.lower()
        if nickname == "@reboot":
            raise exceptions.InvalidCronExpression("'@reboot' has no fixed time and is not supported.")
        if nickname.startswith("@every"):
            raise exceptions.InvalidCronExpression(
                f"{_shown(text)} is not a cron expression; declare an interval with every=<seconds> instead."
            )
        if nickname not in NICKNAMES:
            known = ", ".join(NICKNAMES)
            raise exceptions.InvalidCronExpression(f"Unknown cron nickname {_shown(text)}; known ones are {known}.")
        text = NICKNAMES[nickname]
    parts = text.split()
    if len(parts) != len(_FIELD_SPECS):
        seconds = " (a seconds field is not supported; use every= for intervals)" if len(parts) == 6 else ""
        raise exceptions.InvalidCronExpression(
            f"Cron expression {_shown(expr)} has {len(parts)} field(s); expected 5: "
            f"minute hour day-of-month month day-of-week{seconds}."
        )
    minutes, hours, days_of_month, months, days_of_week = (
        _parse_field(spec, part) for spec, part in zip(_FIELD_SPECS, parts, strict=True)
    )
    fields = Fields(
        minutes=minutes,
        hours=hours,
        days_of_month=days_of_month,
        months=months,
        days_of_week=frozenset(d % 7 for d in days_of_week),
        dom_restricted=not parts[2].startswith("*"),
        dow_restricted=not parts[4].startswith("*"),
        wildcard_time=parts[0].startswith("*") or parts[1].startswith("*"),
    )
    reachable = any(day <= _MONTH_DAYS[month] for month in fields.months for day in fields.days_of_month)
    if not fields.dow_restricted and not reachable:
        raise exceptions.InvalidCronExpression(
            f"Cron expression {expr!r} never fires: none of its months has any of its days of the month."
        )
    parts[4] = _celery_day_of_week(parts[4], fields.days_of_week)
    return " ".join(parts), fields


def _parse_field(spec: _FieldSpec, text: str) -> frozenset[int]:
    """Check one field strictly and expand it to its values (day of week: 0..7, 7 not yet folded)."""
    if len(text) > spec.max_length:
        raise exceptions.InvalidCronExpression(
            f"The {spec.name} field {_shown(text)} is {len(text)} characters long; at most {spec.max_length} "
            "fit in the crontab table."
        )
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise exceptions.InvalidCronExpression(f"The {spec.name} field {text!r} has an empty list item.")
        match = _PART.fullmatch(part)
        if match is None:
            raise exceptions.InvalidCronExpression(f"The {spec.name} field {text!r} cannot be parsed at {part!r}.")
        low, high, step = match.group("low", "high", "step")
        if step is not None:
            if low is not None and high is None:
                raise exceptions.InvalidCronExpression(
                    f"The {spec.name} field {text!r}: a step needs '*' or a range before it "
                    f"(e.g. '*/{step}' or '{low}-{spec.high}/{step}'), not {part!r}."
                )
            if len(step.lstrip("0")) > _MAX_DIGITS:
                raise exceptions.InvalidCronExpression(
                    f"The {spec.name} field {_shown(text)}: the step {_shown(step)} is too large."
                )
            if int(step) == 0:
                raise exceptions.InvalidCronExpression(f"The {spec.name} field {text!r}: a step must be at least 1.")
        first = spec.low if low is None else _value(spec, text, low)
        last = spec.high if low is None else first if high is None else _value(spec, text, high)
        values.update(_expand(spec, first, last)[:: int(step) if step is not None else 1])
    return frozenset(values)


def _expand(spec: _FieldSpec, first: int, last: int) -> list[int]:
    """The values of ``first-last`` in order; a descending range wraps around the end, as in Celery.

    Day of week: an ascending range runs over 0..7 as in Vixie cron (``0-7/2`` is 0, 2, 4, 6;
    ``1-7/3`` is 1, 4, 7), values folded later; a descending one (``fri-mon``) wraps around the week
    0..6 after folding 7 onto 0, so that Sunday comes once (``fri-mon/2`` is Friday and Sunday).
    """
    if first <= last:
        return list(range(first, last + 1))
    low, high = spec.low, spec.high
    if spec is _DAY_OF_WEEK:
        first, last, high = first % 7, last % 7, 6
        if first <= last:
            return list(range(first, last + 1))
    return list(range(first, high + 1)) + list(range(low, last + 1))


def _value(spec: _FieldSpec, text: str, atom: str) -> int:
    """A number or name of the field, checked against its range."""
    if atom.isdigit():
        digits = atom.lstrip("0") or "0"
        if len(digits) > _MAX_DIGITS or not spec.low <= int(digits) <= spec.high:
            raise exceptions.InvalidCronExpression(
                f"The {spec.name} field {_shown(text)}: {digits if len(digits) <= _MAX_DIGITS else _shown(digits)} "
                f"is out of range {spec.low}-{spec.high}."
            )
        return int(digits)
    if atom.lower() in spec.names:
        return spec.names.index(atom.lower()) + (1 if spec is _MONTH else 0)
    if spec.names:
        allowed = f"{spec.names[0]}..{spec.names[-1]}"
        raise exceptions.InvalidCronExpression(
            f"The {spec.name} field {text!r}: {atom!r} is not a number or a name ({allowed})."
        )
    raise exceptions.InvalidCronExpression(f"The {spec.name} field {text!r}: {atom!r} is not a number.")


def _celery_day_of_week(text: str, days: frozenset[int]) -> str:
    """The day-of-week field as Celery's crontab reads it: as written, unless it names day 7.

    Celery accepts 0..6 only, and django-celery-beat's beat drops an entry it cannot read without
    a word, so a field naming 7 (``7``, ``1-7``, ``fri-7``) is written as the list of its days.
    Such a field never starts with ``*``, nor does its rewrite: whether it restricts the days
    (the Vixie rule in ``Fields``) is unchanged.
    """
    atoms = (match.group("low", "high") for match in map(_PART.fullmatch, text.split(",")) if match is not None)
    if not any(atom is not None and atom.isdigit() and int(atom) == 7 for pair in atoms for atom in pair):
        return text
    runs: list[list[int]] = []
    for day in sorted(days):
        if runs and day == runs[-1][-1] + 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def _shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for an error message, shortened when long (a 5,000-digit number, say)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[: limit // 2]!r}...({len(text)} characters)"
