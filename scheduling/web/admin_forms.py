"""Forms of Timekeeper's admin pages: schedule a job, reschedule jobs, edit a fixed-time policy.

Every check is ``scheduling.api``'s or ``scheduling.fixed.policies``': the admin refuses exactly what
``schedule()`` refuses, with the same words, and a refused form stores nothing.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, cast

from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput
from django.utils import timezone

from scheduling.core import conf, exceptions, registry, validation
from scheduling.models import SchedulePolicy


class PayloadField(forms.JSONField):
    """A JSON object typed by a person: size-capped before parsing, deep nesting is a form error."""

    default_error_messages = {
        "invalid": 'Enter valid JSON (for example {"user_id": 1}).',
        "too_deep": "The JSON is nested too deeply.",
        "too_large": "The payload text is %(size)d bytes; the limit is %(limit)d bytes.",
    }

    def _limit(self) -> int:
        # Typed JSON may carry indentation; the API's own check is on the compact encoding.
        return 2 * conf.get().max_payload_bytes

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str):
            size = len(value.encode())
            if size > self._limit():
                raise ValidationError(
                    self.error_messages["too_large"], code="too_large", params={"size": size, "limit": self._limit()}
                )
        try:
            return super().to_python(value)
        except RecursionError:
            raise ValidationError(self.error_messages["too_deep"], code="too_deep") from None
        except ValueError:  # NaN and friends are refused by the encoder later; non-JSON text here
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return InvalidJSONInput(data)


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


class NewJobForm(forms.Form):
    """The admin's "add scheduled job": the arguments of ``scheduling.api.schedule``."""

    kind = forms.ChoiceField(help_text="The registered handler to run.")
    payload = PayloadField(
        initial=dict, required=False, help_text="The handler's arguments, a JSON object checked by the kind's schema."
    )
    due_at = DueAtField(
        required=False,
        label="Due at",
        help_text="Give a due time or a delay, not both.",
    )
    delay_seconds = forms.FloatField(
        required=False, min_value=0, label="or delay (seconds)", help_text="From now, by the database clock."
    )
    key = forms.CharField(
        required=False,
        max_length=validation.MAX_KEY_LENGTH,
        help_text="Optional business key (e.g. trial-ending:42): at most one pending or running job per key.",
    )
    on_conflict = forms.ChoiceField(
        choices=[
            ("error", "error: refuse when the key already has a live job"),
            ("replace", "replace: move the key's pending job to this time and payload"),
            ("keep", "keep: leave the key's job as it is"),
        ],
        initial="error",
        help_text="What to do when the key is taken.",
    )
    max_attempts = forms.IntegerField(
        required=False, min_value=1, max_value=1000, help_text="Empty: the kind's default."
    )
    owner = forms.ModelChoiceField(
        queryset=get_user_model().objects.order_by("username"),
        required=False,
        help_text="Who the job belongs to (the jobs API shows it only to them and to staff).",
    )

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        cast(forms.ChoiceField, self.fields["kind"]).choices = [("", "---------"), *kind_choices(user)]
        zone = timezone.get_current_timezone_name()
        self.fields["due_at"].help_text = f"In {zone}. Give a due time or a delay, not both."

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("payload") is None and "payload" not in self.errors:
            data["payload"] = {}
        if data.get("due_at") is None and data.get("delay_seconds") is None and not self.errors.get("due_at"):
            raise ValidationError("Give a due time or a delay.")
        if self.user is not None and not self.user.is_superuser and data.get("kind") and "payload" not in self.errors:
            # Superusers may schedule any kind here; everyone else what the kind's Access allows.
            try:
                kind = registry.get(data["kind"])
                validation.encode_payload(kind, data["payload"])
                validation.check_access(kind, self.user, data["payload"])
            except exceptions.SchedulingError as exc:
                self.add_scheduling_error(exc)
        return data

    def schedule_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``api.schedule`` (after ``is_valid()``)."""
        data = self.cleaned_data
        out: dict[str, Any] = {
            "key": data.get("key") or None,
            "on_conflict": data["on_conflict"],
            "max_attempts": data.get("max_attempts"),
            "owner": data.get("owner"),
        }
        if data.get("due_at") is not None:
            out["due_at"] = data["due_at"]
        if data.get("delay_seconds") is not None:
            out["delay"] = data["delay_seconds"]
        return out

    def add_scheduling_error(self, exc: exceptions.SchedulingError) -> None:
        """Attach an error of ``api.schedule`` to the field it is about."""
        if isinstance(exc, exceptions.UnknownJobKind | exceptions.KindNotAllowed):
            field: str | None = "kind"
        elif isinstance(exc, exceptions.InvalidPayload):
            field = "payload"
        elif isinstance(exc, exceptions.KeyConflict | exceptions.JobStateConflict):
            field = "key"
        else:
            field = None
        self.add_error(field, str(exc))


class RescheduleForm(forms.Form):
    """The intermediate page of the "reschedule" action."""

    due_at = DueAtField(label="New due time")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["due_at"].help_text = f"In {timezone.get_current_timezone_name()}."

    def clean_due_at(self) -> dt.datetime:
        value = self.cleaned_data["due_at"]
        try:
            return validation.check_due_at(value)
        except exceptions.InvalidSchedule as exc:
            raise ValidationError(str(exc)) from None


class SchedulePolicyForm(forms.ModelForm):
    """A periodic task's policy inline, validated by ``policies.validate_policy`` against the task being saved."""

    kind = forms.ChoiceField(help_text="The registered handler each run calls.")
    payload = PayloadField(initial=dict, required=False, help_text="Arguments handed to the handler on every run.")

    class Meta:
        model = SchedulePolicy
        fields = [
            "kind",
            "payload",
            "expression",
            "concurrency_policy",
            "starting_deadline_seconds",
            "active_deadline_seconds",
            "backoff_limit",
            "successful_history_limit",
            "failed_history_limit",
            "suspend",
            "missed_policy",
            "missed_window_seconds",
            "dst_gap",
        ]

    def __init__(self, *args: Any, periodic_task: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.periodic_task = periodic_task
        cast(forms.ChoiceField, self.fields["kind"]).choices = [("", "---------"), *kind_choices()]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("payload") is None and "payload" not in self.errors:
            data["payload"] = {}
        if self.errors or self.periodic_task is None:
            return data
        from scheduling.fixed import policies

        candidate = SchedulePolicy(**{name: data[name] for name in self.Meta.fields if name in data})
        try:
            policies.validate_policy(candidate, periodic_task=self.periodic_task)
        except exceptions.SchedulingError as exc:
            field = getattr(exc, "field", None)
            self.add_error(field if field in self.fields else None, str(exc))
        return data


class PolicyFormSet(forms.BaseInlineFormSet):
    """Hands the periodic task being saved (with its new crontab or interval) to the policy form."""

    def get_form_kwargs(self, index: int | None) -> dict[str, Any]:
        return {**super().get_form_kwargs(index), "periodic_task": self.instance}


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
