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

from scheduling.core import exceptions, registry, validation
from scheduling.fixed import spec
from scheduling.models import MAX_PRIORITY, MIN_PRIORITY, SchedulePolicy


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
        cast(forms.ChoiceField, self.fields["kind"]).choices = [("", "---------"), *kind_choices(user)]
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
    """A periodic task's policy inline: the one place to edit a schedule's timing.

    The timing is the policy's expression in ``timezone``, or ``every_seconds``; on save the admin
    writes it into the task's crontab or interval (``declarations.apply_policy``), whose fields are
    then not on the page. Pausing is the task's "Enabled" box alone: ``suspend`` is not on the form
    and follows it. Without an expression or interval (adding a task), the task's own crontab or
    interval is validated, as before.
    """

    kind = forms.ChoiceField(help_text="The registered handler each run calls.")
    payload = PayloadField(initial=dict, required=False, help_text="Arguments handed to the handler on every run.")
    timezone = forms.CharField(
        required=False,
        max_length=63,
        initial="UTC",
        help_text="The IANA zone the cron expression is read in (e.g. Europe/Lisbon); empty: UTC.",
    )
    every_seconds = forms.IntegerField(
        required=False,
        min_value=1,
        label="every (seconds)",
        help_text="Instead of a cron expression: run every this many seconds.",
    )

    class Meta:
        model = SchedulePolicy
        fields = ["expression", *spec.PolicySpec.names()]

    def __init__(self, *args: Any, periodic_task: Any = None, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.periodic_task = periodic_task
        self.user = user  # None: every kind (code, superusers); else only the kinds their Access offers them
        offered = kind_choices(None if user is None or getattr(user, "is_superuser", False) else user)
        cast(forms.ChoiceField, self.fields["kind"]).choices = [("", "---------"), *offered]
        if periodic_task is not None and periodic_task.pk is not None:
            from scheduling.fixed import policies

            if periodic_task.crontab_id is not None:
                self.fields["timezone"].initial = str(periodic_task.crontab.timezone)
                if not self.initial.get("expression"):
                    self.initial["expression"] = policies.crontab_expression(periodic_task.crontab)
            elif periodic_task.interval_id is not None:
                self.fields["every_seconds"].initial = int(policies.interval_seconds(periodic_task.interval))

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("payload") is None and "payload" not in self.errors:
            data["payload"] = {}
        if self.user is not None and not self.user.is_superuser and data.get("kind") and not self.errors:
            # A fixed-time run has no owner: a person may set up only what they could schedule themselves.
            try:
                kind = registry.get(data["kind"])
                validation.encode_payload(kind, data["payload"])
                validation.check_access(kind, self.user, data["payload"])
            except exceptions.SchedulingError as exc:
                self.add_error("payload" if isinstance(exc, exceptions.InvalidPayload) else "kind", str(exc))
        if self.errors or self.periodic_task is None:
            return data
        from scheduling.fixed import policies

        model_fields = {f.name for f in SchedulePolicy._meta.get_fields()}
        candidate = SchedulePolicy(
            **{name: data[name] for name in self.Meta.fields if name in data and name in model_fields}
        )
        try:
            if data.get("expression") or data.get("every_seconds"):
                timing = policies.timing_from(
                    data.get("expression") or "",
                    data.get("timezone") or "",
                    data.get("every_seconds"),
                    candidate.dst_gap,
                )
                policies.check(timing, spec.PolicySpec.of(candidate))
            else:
                policies.validate_policy(candidate, periodic_task=self.periodic_task)
        except exceptions.SchedulingError as exc:
            field = getattr(exc, "field", None)
            self.add_error(field if field in self.fields else None, str(exc))
        return data


POLICY_TIMING_FIELDS = ("expression", "timezone", "every_seconds")  # the form's own, beside the spec's


def policy_fieldsets(readonly: tuple[str, ...] = ()) -> Any:
    """The policy inline's fieldsets, ``((title, {"fields": names}), ...)``: the spec's groups
    (``spec.GROUPS``), the timing after what runs, ``readonly`` (the anchor and last tick) with the history."""
    extra: dict[str | None, tuple[str, ...]] = {spec.RUN: POLICY_TIMING_FIELDS, spec.HISTORY: readonly}
    return tuple((group, {"fields": (*spec.PolicySpec.grouped(group), *extra.get(group, ()))}) for group in spec.GROUPS)


class PolicyFormSet(forms.BaseInlineFormSet):
    """Hands the periodic task being saved (with its new crontab or interval) and the person to the policy form."""

    user: Any = None  # set per request by the inline (SchedulePolicyInline.get_formset)

    def get_form_kwargs(self, index: int | None) -> dict[str, Any]:
        return {**super().get_form_kwargs(index), "periodic_task": self.instance, "user": self.user}


def restrict_periodic_task_form(form_class: type[forms.ModelForm], user: Any) -> type[forms.ModelForm]:
    """django-celery-beat's periodic task form for a person who is not a superuser: ``scheduling.run_fixed`` only.

    A periodic task sends its task with its args, kwargs and headers as the system, with no schema
    or access check; a Celery message header even overrides the task's name. So everyone but a
    superuser may only save ``scheduling.run_fixed`` naming the task itself (its policy says what
    runs, checked by ``SchedulePolicyForm``), with no args and no headers. A forged POST of another
    task, other kwargs or headers is a form error; nothing is saved.
    """
    from scheduling.core import tasknames

    allowed = tasknames.RUN_FIXED

    class RestrictedPeriodicTaskForm(form_class):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fields["regtask"] = forms.ChoiceField(
                label="Task (registered)", choices=[("", ""), (allowed, allowed)], required=False
            )
            self.fields["task"].help_text = f"Only {allowed} (a fixed-time schedule with a policy below)."

        def clean(self) -> dict[str, Any]:
            data: dict[str, Any] = super().clean()
            if data.get("task") and data["task"] != allowed:
                self.add_error("task", f"Only a superuser may save a periodic task for {data['task']}; use {allowed}.")
            for field, empty in (("args", []), ("headers", {})):
                try:
                    value = json.loads(data.get(field) or "null")
                except ValueError:
                    continue  # beat's own check reports it
                if value not in (None, empty):
                    self.add_error(field, f"Only a superuser may set {field} on a periodic task.")
            name = data.get("name") or ""
            try:
                kwargs = json.loads(data.get("kwargs") or "{}")
            except ValueError:
                kwargs = None
            if kwargs not in ({}, {"schedule": name}, None):
                self.add_error("kwargs", f'{allowed} takes only {{"schedule": "<this task\'s name>"}}.')
            data["args"], data["headers"] = "[]", "{}"
            data["kwargs"] = json.dumps({"schedule": name})
            return data

    RestrictedPeriodicTaskForm.__name__ = f"Restricted{form_class.__name__}"
    return RestrictedPeriodicTaskForm


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


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
                "schema": pretty_json(kind.schema) if kind.schema is not None else "any JSON object",
                "example": pretty_json(example_payload(kind.schema)),
            }
        )
    return out
