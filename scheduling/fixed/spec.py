"""The one definition of a fixed-time schedule's policy fields: ``PolicySpec``.

Everything a schedule does at its ticks besides its timing: the kind and payload each run hands
to, the overlap policy, the deadlines, retries, history limits, missed ticks and the DST rule.
Each field is the ``SchedulePolicy`` column of the same name, and its default is that column's
(read from the model, so it is written once). The fields drive, with nothing listed again:

- the declaration: ``declarations.Declaration`` is a ``PolicySpec`` plus its name and timing, and
  ``declare()``/``make()`` take every field as a keyword;
- the model sync: ``sync()`` writes ``columns()`` into the policy row;
- the admin: the policy form's fields and the inline's fieldsets (``GROUPS``, by each field's group);
- the check: ``policies.check(timing, spec)`` takes one ``PolicySpec`` (``PolicySpec.of(row)``
  for a policy row or a form's data).

A new policy field is a column (with its migration), a line here, and the code that carries it
out (``gate.py`` or ``ticks.py``), plus its rule in ``policies.check`` if it has one
(docs/architecture.md, "How to add a fixed-time policy").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

from django.db import models

from scheduling.models import SchedulePolicy

RUN = None  # the fieldset without a title: what runs (the admin adds the timing fields to it)
OVERLAP = "Overlap and deadlines"
MISSED = "Missed ticks and clock changes"
HISTORY = "History"
GROUPS = (RUN, OVERLAP, MISSED, HISTORY)  # the admin's fieldsets, in this order


def _column(name: str, group: str | None) -> Any:
    """A spec field whose default is the model column's."""
    column = cast(models.Field, SchedulePolicy._meta.get_field(name))  # a column, not a relation
    default = column.get_default()
    return dataclasses.field(default=str(default) if isinstance(default, str) else default, metadata={"group": group})


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicySpec:
    """A fixed-time schedule's policy, as plain values (see the module docstring)."""

    kind: str = dataclasses.field(metadata={"group": RUN})
    payload: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"group": RUN})  # the column's default
    concurrency_policy: str = _column("concurrency_policy", OVERLAP)
    starting_deadline_seconds: int | None = _column("starting_deadline_seconds", OVERLAP)
    active_deadline_seconds: int | None = _column("active_deadline_seconds", OVERLAP)
    backoff_limit: int = _column("backoff_limit", OVERLAP)
    missed_policy: str = _column("missed_policy", MISSED)
    missed_window_seconds: int = _column("missed_window_seconds", MISSED)
    dst_gap: str = _column("dst_gap", MISSED)
    successful_history_limit: int = _column("successful_history_limit", HISTORY)
    failed_history_limit: int = _column("failed_history_limit", HISTORY)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The policy's fields (``SchedulePolicy`` columns), in the order of the admin's fieldsets."""
        return tuple(field.name for field in dataclasses.fields(PolicySpec))

    @classmethod
    def grouped(cls, group: str | None) -> tuple[str, ...]:
        """The fields of one of ``GROUPS``."""
        return tuple(field.name for field in dataclasses.fields(PolicySpec) if field.metadata["group"] == group)

    @classmethod
    def of(cls, source: Any) -> PolicySpec:
        """The spec of a policy row, a declaration or a mapping (a form's cleaned data): each field it has."""
        if isinstance(source, Mapping):
            values = {name: source[name] for name in cls.names() if name in source}
        else:
            values = {name: getattr(source, name) for name in cls.names() if hasattr(source, name)}
        return PolicySpec(**values)

    def columns(self) -> dict[str, Any]:
        """The policy row's columns these values set (the model sync writes them)."""
        return {name: getattr(self, name) for name in PolicySpec.names()}


__all__ = ["GROUPS", "PolicySpec"]
