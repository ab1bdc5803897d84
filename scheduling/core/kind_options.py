"""The per-kind options an operator sets (kind controls), declared once: ``KIND_OPTIONS``.

Each row says everything the doors need about one option: its name (the ``KindControl`` column
and the field in every door), its type and bounds, the verb that sets it (the JSON API's
``POST /api/kinds/<kind>/<verb>``, the admin Kinds page's button, ``manage.py timekeeper kinds
<verb>``, the audit action), what an operator calls it, its help, and how a value reads in a
sentence. Drawn from it: the setter ``scheduling.api.set_kind_option`` (its check), the kind
controls' rows and ``kind_overview`` (an ``options`` mapping, read by name), the admin Kinds page
(its column, form and messages), the kinds JSON API (routes, bodies, errors) and its OpenAPI
schemas, the CLI's verbs and table, and the dashboard's kinds table.

A new option is a row here, its model field and migration, its column in ``due_at/sql/kinds.sql``
(the setter's two lists) and whatever reads it where it acts (the claim: ``due_at/sql/claim.sql``).
Pausing is no option: it is a state with its own verbs (pause, resume).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from scheduling.core import exceptions, validation


@dataclasses.dataclass(frozen=True)
class KindOption:
    """One per-kind option: what it is called, what it takes, and how operators see and set it."""

    name: str  # the KindControl column and the field in every door: "max_running"
    verb: str  # what sets it: API path, admin action, CLI verb, audit action: "cap"
    noun: str  # what an operator calls it, in headers and messages: "cap"
    label: str  # a form field's label: "max running"
    help: str  # what a value does (the OpenAPI description)
    summary: str  # what setting it does, in one line (the API operation, the CLI verb's help)
    shows: str  # a value in a sentence, "{value}" replaced: "at most {value} running at once"
    unset: str  # what no value (None) means: "no cap"
    done: str  # the log's action word: "capped"
    minimum: float
    maximum: float
    type: type = int  # int or float; every option may be None (unset)

    @property
    def what(self) -> str:
        """The values it takes, in words."""
        number = "a whole number" if self.type is int else "a number"
        return f"{number} from {plain(self.minimum)} to {plain(self.maximum)}"

    @property
    def step(self) -> str:
        """A number input's step: 1 for whole numbers, any otherwise."""
        return "1" if self.type is int else "any"

    def check(self, value: Any) -> Any:
        """``value`` if the option takes it (None: unset), else ``InvalidSchedule`` naming the bounds."""
        if value is None:
            return None
        kinds = (int,) if self.type is int else (int, float)
        if (
            isinstance(value, bool)
            or not isinstance(value, kinds)
            or not self.minimum <= value <= self.maximum  # before isfinite(), which a huge int overflows
            or not math.isfinite(value)
        ):
            raise exceptions.InvalidSchedule(f"{self.name} must be {self.what}, got {validation.shown_number(value)}.")
        return value

    def parse(self, text: str) -> Any:
        """A value typed by a person (the CLI): ``none`` unsets; ``ValueError`` when it is no number of the type."""
        if text.lower() == "none":
            return None
        if self.type is int:
            if not (text.isascii() and text.isdecimal()) or len(text) > len(str(int(self.maximum))):
                raise ValueError(text)
            return int(text)
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(text)
        return number

    def describe(self, value: Any) -> str:
        """A value in a sentence (None: what unset means)."""
        return self.unset if value is None else self.shows.format(value=value)

    def show(self, value: Any, none: str = "none") -> str:
        """A value in a table cell (None: ``none``)."""
        return none if value is None else f"{value}"

    def json_schema(self) -> dict[str, Any]:
        """The OpenAPI schema of a value the setter takes."""
        kind = "integer" if self.type is int else "number"
        return {
            "type": kind,
            "nullable": True,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "description": self.help,
        }

    def reading_schema(self) -> dict[str, Any]:
        """The OpenAPI schema of the value a kind's overview shows."""
        return {"type": "integer" if self.type is int else "number", "nullable": True, "minimum": self.minimum}


def plain(number: float) -> str:
    """A bound as a person writes it: 1000000, not 1e+06 or 1000000.0."""
    return str(int(number)) if float(number).is_integer() else str(number)


KIND_OPTIONS: tuple[KindOption, ...] = (
    KindOption(
        name="max_running",
        verb="cap",
        noun="cap",
        label="max running",
        help="At most this many of the kind's jobs claimed or running at once; null: no cap.",
        summary="Cap how many of a kind's jobs are claimed or running at once, cluster-wide.",
        shows="at most {value} running at once",
        unset="no cap",
        done="capped",
        minimum=1,
        maximum=1_000_000,
    ),
)

BY_NAME = {option.name: option for option in KIND_OPTIONS}
BY_VERB = {option.verb: option for option in KIND_OPTIONS}


def by_verb(verb: str) -> KindOption | None:
    """The option ``verb`` sets (None: no option's verb)."""
    return BY_VERB.get(verb)
