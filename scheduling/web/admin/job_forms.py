"""Forms of the scheduled jobs' pages: schedule a job, change its due time, reschedule a selection.

Every check is ``scheduling.api``'s: the admin refuses exactly what ``schedule()`` refuses, with the
same words, and a refused form stores nothing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.utils import timezone

from scheduling.core import exceptions, options, registry, validation
from scheduling.models import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    JobState,
    ScheduledJob,
)
from scheduling.web.admin import common


class ChangeJobForm(forms.ModelForm):
    """A job's change page edits only the due time of a pending job (``api.reschedule``)."""

    class Meta:
        model = ScheduledJob
        fields = ["due_at"]

    def clean_due_at(self) -> Any:
        value = self.cleaned_data["due_at"]
        common.check_year(value)
        return value

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if "due_at" in self.changed_data and data.get("due_at") is not None:
            # Lock the row until the admin's transaction ends: the claim skips locked rows, so the
            # state seen here is still the state when api.reschedule runs.
            state = (
                ScheduledJob.objects.select_for_update()
                .filter(pk=self.instance.pk)
                .values_list("state", flat=True)
                .first()
            )
            if state != JobState.PENDING:
                self.add_error("due_at", str(exceptions.JobNotReschedulable(self.instance.pk, state or "gone")))
        return data


class ReplaceNotAllowed(Exception):
    """Raised inside the add form's transaction when ``replace`` met a live job the person may not change."""

    def __init__(self, job_id: int) -> None:
        super().__init__(
            f"The key already has a pending job ({job_id}); replacing it needs the permission to change scheduled "
            "jobs (scheduling.change_scheduledjob). Nothing was changed: use on_conflict=error or keep, or another key."
        )


class NewJobForm(forms.Form):
    """The admin's "add scheduled job": the arguments of ``scheduling.api.schedule``."""

    kind = forms.ChoiceField(help_text="The registered handler to run.")
    payload = common.PayloadField(
        initial=dict, required=False, help_text="The handler's arguments, a JSON object checked by the kind's schema."
    )
    due_at = common.DueAtField(
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
            ("replace", "replace: move the key's pending job to this time and payload"),
            ("keep", "keep: leave the key's job as it is"),
            ("error", "error: refuse when the key already has a live job"),
        ],
        initial="replace",  # api.schedule's and the JSON API's default (a test holds them together)
        help_text="What to do when the key is taken (the API's default: replace).",
    )
    max_attempts = forms.IntegerField(
        required=False, min_value=1, max_value=1000, help_text="Empty: the kind's default."
    )
    unique_for = forms.FloatField(
        required=False,
        min_value=0,
        label="Unique for (seconds)",
        help_text="A uniqueness window: a job of this kind with the same key (or, without one, the same payload) "
        "in the same window is a duplicate, answered by on_conflict. Empty: the kind's; 0: not unique.",
    )
    unique_states = forms.MultipleChoiceField(
        choices=[(s, s) for s in options.UNIQUE_STATES_CHOICES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=f"The states in which a job holds its window. None ticked: the kind's "
        f"(by default {', '.join(options.DEFAULT_UNIQUE_STATES)}); {', '.join(options.UNIQUE_STATES_ALWAYS)} "
        "always hold it.",
    )
    priority = forms.TypedChoiceField(
        choices=[("", "the kind's default"), *[(str(n), str(n)) for n in range(MIN_PRIORITY, MAX_PRIORITY + 1)]],
        coerce=int,
        empty_value=None,
        required=False,
        help_text=f"{MIN_PRIORITY}-{MAX_PRIORITY}: among due jobs, a higher priority is claimed first.",
    )
    owner = forms.ModelChoiceField(
        queryset=get_user_model().objects.all(),
        required=False,
        help_text="The user's id (the magnifier looks one up). The jobs API shows the job only to them and to staff.",
    )

    def __init__(self, *args: Any, user: Any = None, admin_site: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        if self.schedules_as_self:
            # Not a superuser: the job is theirs, in their own key namespace (a posted owner is ignored).
            del self.fields["owner"]
        elif admin_site is not None:
            # A raw id with a lookup, not a select of every user (which grows with the user table).
            from django.contrib.admin.widgets import ForeignKeyRawIdWidget

            from scheduling.models import ScheduledJob

            remote = ScheduledJob._meta.get_field("owner").remote_field
            self.fields["owner"].widget = ForeignKeyRawIdWidget(remote, admin_site)
        cast(forms.ChoiceField, self.fields["kind"]).choices = [("", "---------"), *common.kind_choices(user)]
        zone = timezone.get_current_timezone_name()
        self.fields["due_at"].help_text = f"In {zone}. Give a due time or a delay, not both."

    @property
    def schedules_as_self(self) -> bool:
        """Whether the job's owner is the person filling the form (everyone but superusers)."""
        return self.user is not None and not getattr(self.user, "is_superuser", False)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("payload") is None and "payload" not in self.errors:
            data["payload"] = {}
        # The window's checks are api.schedule's (options.check_unique_*), with their words, on their fields.
        for name, check in (("unique_for", options.check_unique_for), ("unique_states", options.check_unique_states)):
            if data.get(name) not in (None, []):
                try:
                    check(data[name])
                except exceptions.InvalidSchedule as exc:
                    self.add_error(name, str(exc))
        if data.get("due_at") is None and data.get("delay_seconds") is None and not self.errors.get("due_at"):
            raise ValidationError("Give a due time or a delay.")
        if self.user is not None and not self.user.is_superuser and data.get("kind") and "payload" not in self.errors:
            # Superusers may schedule any kind here; everyone else what the kind's Access allows.
            # The JSON API's caller limits too: the kind's attempts and priority bounds, no past due time.
            try:
                kind = registry.get(data["kind"])
                validation.encode_payload(kind, data["payload"])
                validation.check_access(kind, self.user, data["payload"])
                validation.check_caller_limits(
                    kind, self.user, max_attempts=data.get("max_attempts"), priority=data.get("priority")
                )
                if data.get("due_at") is not None:
                    validation.check_not_past(data["due_at"])
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
            "owner": self.user if self.schedules_as_self else data.get("owner"),
            "priority": data.get("priority"),
        }
        if data.get("due_at") is not None:
            out["due_at"] = data["due_at"]
        if data.get("delay_seconds") is not None:
            out["delay"] = data["delay_seconds"]
        if data.get("unique_for") is not None:
            out["unique_for"] = data["unique_for"]
        if data.get("unique_states"):
            out["unique_states"] = data["unique_states"]
        return out

    def add_scheduling_error(self, exc: exceptions.SchedulingError) -> None:
        """Attach an error of ``api.schedule`` to the field it is about."""
        if isinstance(exc, exceptions.UnknownJobKind | exceptions.KindNotAllowed):
            field: str | None = "kind"
        elif isinstance(exc, exceptions.InvalidPayload):
            field = "payload"
        elif isinstance(exc, exceptions.KeyConflict | exceptions.JobStateConflict):
            field = "key"
        elif isinstance(exc, exceptions.OverCallerLimit) and exc.field in self.fields:
            field = exc.field
        else:
            field = None
        self.add_error(field, str(exc))


class RescheduleForm(forms.Form):
    """The intermediate page of the "reschedule" action."""

    due_at = common.DueAtField(label="New due time")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["due_at"].help_text = f"In {timezone.get_current_timezone_name()}."

    def clean_due_at(self) -> dt.datetime:
        value = self.cleaned_data["due_at"]
        try:
            return validation.check_due_at(value)
        except exceptions.InvalidSchedule as exc:
            raise ValidationError(str(exc)) from None


EXAMPLE_DEPTH = 6  # nesting followed when making an example payload from a schema


def example_payload(schema: dict[str, Any] | None, depth: int = 0) -> Any:
    """A payload shaped like ``schema`` (its examples, defaults, consts or enums first; else a plain value per type).

    A hint for a person filling the add form, not a guarantee: formats and patterns are not followed.
    """
    if not isinstance(schema, dict) or depth > EXAMPLE_DEPTH:
        return {}
    for word in ("examples",):
        if isinstance(schema.get(word), list) and schema[word]:
            return schema[word][0]
    for word in ("default", "const"):
        if word in schema:
            return schema[word]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for word in ("oneOf", "anyOf", "allOf"):
        if isinstance(schema.get(word), list) and schema[word]:
            return example_payload(schema[word][0], depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object":
        properties = schema.get("properties") or {}
        required = schema.get("required") or list(properties)
        return {name: example_payload(properties[name], depth + 1) for name in required if name in properties}
    if kind == "array":
        return [example_payload(schema.get("items"), depth + 1)] if schema.get("items") else []
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return schema.get("minimum", 1.0)
    if kind == "boolean":
        return False
    if kind == "string":
        return "text" if not schema.get("minLength") else "x" * int(schema["minLength"])
    return None


def kind_help(kinds: list[tuple[str, str]]) -> list[dict[str, str]]:
    """For the add form: each offered kind's description, schema and an example payload made from it."""
    out = []
    for name, _label in kinds:
        kind = registry.get(name)
        out.append(
            {
                "name": name,
                "description": kind.description,
                "schema": common.pretty_json(kind.schema) if kind.schema is not None else "any JSON object",
                "example": common.pretty_json(example_payload(kind.schema)),
            }
        )
    return out
