"""Parts every page of Timekeeper's admin shares: times to the second, a checked selection, form fields.

The form fields check with ``scheduling.core.validation``, so the admin refuses what the API
refuses, with the same words.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils import timezone

from scheduling.core import exceptions, registry, validation


def seconds_text(value: Any) -> str:
    """A time in the current zone to the second: 2031-06-07 08:09:10 UTC."""
    if value is None:
        return "—"
    return f"{timezone.localtime(value):%Y-%m-%d %H:%M:%S %Z}"


def duration_text(value: dt.timedelta) -> str:
    """A run time: 12 ms, 4.2 s, 3 min 5 s, 2 h 10 min."""
    seconds = max(value.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    return f"{minutes // 60} h {minutes % 60} min"


def to_the_second(field: str, description: str) -> Callable[[Any, Any], str]:
    """An admin display method showing the time ``field`` of a row with seconds (``seconds_text``)."""

    @admin.display(description=description)
    def show(model_admin: Any, obj: Any) -> str:
        return seconds_text(getattr(obj, field))

    return show


class CheckedSelectionMixin:
    """Actions answer 400 when ``_selected_action`` holds something that is not a row id (not a 500 in the ORM)."""

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if any(validation.row_id_text(value) is None for value in selected):
            return HttpResponseBadRequest("The selection holds something that is not a row id.")
        return super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]


class PayloadField(forms.JSONField):
    """A JSON object typed by a person: size-capped before parsing, deep nesting is a form error."""

    default_error_messages = {
        "invalid": 'Enter valid JSON (for example {"user_id": 1}).',
        "too_deep": "The JSON is nested too deeply.",
        "too_large": "The payload text is %(size)d bytes; the limit is %(limit)d bytes.",
    }

    def _limit(self) -> int:
        # Before the kind is known: the largest kind's limit. Typed JSON may carry indentation; the
        # kind's own check (validation.encode_payload, in the form's clean) is on the compact encoding.
        return 2 * (registry.largest_limits().max_payload_bytes or 0)

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str):
            size = len(value.encode())
            if size > self._limit():
                raise ValidationError(
                    self.error_messages["too_large"], code="too_large", params={"size": size, "limit": self._limit()}
                )
        try:
            parsed = super().to_python(value)
        except RecursionError:
            raise ValidationError(self.error_messages["too_deep"], code="too_deep") from None
        except ValueError:  # NaN and friends are refused by the encoder later; non-JSON text here
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None
        problem = validation.payload_text_problem(parsed)
        if problem:  # "\ud800" or "\u0000" typed as escapes: PostgreSQL cannot store them
            raise ValidationError(
                "The payload cannot be stored: %(problem)s.", code="unstorable", params={"problem": problem}
            )
        return parsed

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            bound = super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return InvalidJSONInput(data)
        if isinstance(data, str) and validation.payload_text_problem(bound):
            return InvalidJSONInput(data)  # shown again as typed: re-encoded, a lone surrogate cannot be written out
        return bound


def kind_choices(user: Any = None) -> list[tuple[str, str]]:
    """Every kind, or with ``user`` (not a superuser) only the kinds whose ``Access`` may let them schedule it."""
    kinds = registry.all_kinds()
    if user is not None and not getattr(user, "is_superuser", False):
        kinds = {name: kind for name, kind in kinds.items() if kind.offered_to(user)}
    return [
        (name, f"{name} — {kind.description}" if kind.description else name) for name, kind in sorted(kinds.items())
    ]


def check_year(value: dt.datetime | None) -> None:
    """The shared due-time checks (window 2000-01-01 .. ten years ahead, offsets) as a form error."""
    if value is None:
        return
    try:
        validation.check_due_at(value)
    except exceptions.InvalidSchedule as exc:
        raise ValidationError(str(exc)) from None


class DueAtField(forms.DateTimeField):
    """A date and time in the current time zone; a wall time that does not exist there (or exists twice) is an error."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S")
    default_validators = [check_year]


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
