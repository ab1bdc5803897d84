"""Forms of the fixed-time schedules' pages: a periodic task's policy, and the periodic task form of non-superusers.

Every check is ``scheduling.fixed.policies``' (and ``fixed.bounds`` for non-superusers): a refused
form stores nothing.
"""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms

from scheduling.core import exceptions, registry, tasknames, validation
from scheduling.fixed import declarations, spec
from scheduling.models import (
    SchedulePolicy,
)
from scheduling.web.admin import common


class SchedulePolicyForm(forms.ModelForm):
    """A periodic task's policy inline: the one place to edit a schedule's timing.

    The timing is the policy's expression in ``timezone``, or ``every_seconds``; on save the admin
    writes it into the task's crontab or interval (``declarations.apply_policy``), whose fields are
    then not on the page. Pausing is the task's "Enabled" box alone: ``suspend`` is not on the form
    and follows it. Without an expression or interval (adding a task), the task's own crontab or
    interval is validated, as before.
    """

    kind = forms.ChoiceField(help_text="The registered handler each run calls.")
    payload = common.PayloadField(
        initial=dict, required=False, help_text="Arguments handed to the handler on every run."
    )
    timezone = forms.CharField(
        required=False,
        max_length=63,
        initial="UTC",
        help_text="The IANA zone the cron expression is read in (e.g. Europe/Lisbon); empty: UTC.",
    )
    every_seconds = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=declarations.MAX_EVERY_SECONDS,
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
        offered = common.kind_choices(None if user is None or getattr(user, "is_superuser", False) else user)
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
        from scheduling.fixed import bounds, policies

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
                timing = policies.timing_of(self.periodic_task, candidate)
            if self.user is not None and not self.user.is_superuser:
                # No owner, no quota: a person may not make a schedule that holds the workers (fixed.bounds).
                bounds.check_caller_bounds(
                    timing,
                    kind=candidate.kind,
                    active_deadline_seconds=candidate.active_deadline_seconds,
                    backoff_limit=candidate.backoff_limit,
                    timing_field="every_seconds" if data.get("every_seconds") else "expression",
                    missed_policy=candidate.missed_policy,
                    concurrency_policy=candidate.concurrency_policy,
                )
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


def disable_fields(form_class: type[forms.ModelForm], names: frozenset[str]) -> type[forms.ModelForm]:
    """``form_class`` with the fields in ``names`` shown read-only: disabled, so their values stay the instance's
    whatever a post says (a schedule declared in code: ``timekeeper sync`` owns them)."""

    class DisabledFieldsForm(form_class):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for name in names & set(self.fields):
                self.fields[name].disabled = True

    DisabledFieldsForm.__name__ = f"Declared{form_class.__name__}"
    return DisabledFieldsForm
