"""Forms of the demo product's pages: start a trial, change when it ends."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone

DEFAULT_TRIAL_DAYS = 14
MAX_TRIAL_DAYS = 366  # a longer "trial" is a typing mistake


class TrialEndField(forms.DateTimeField):
    """When a trial ends, in the current time zone; must be in the future and within a year."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")

    def validate(self, value: Any) -> None:
        super().validate(value)
        now = timezone.now()
        if value is not None and value <= now:
            raise ValidationError("The trial must end in the future.")
        if value is not None and value > now + dt.timedelta(days=MAX_TRIAL_DAYS):
            raise ValidationError(f"A trial lasts at most {MAX_TRIAL_DAYS} days.")


class StartTrialForm(forms.Form):
    plan = forms.ChoiceField(choices=[("pro", "Pro"), ("team", "Team")], initial="pro")
    ends_at = TrialEndField(label="Trial ends at")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["ends_at"].initial = timezone.localtime() + dt.timedelta(days=DEFAULT_TRIAL_DAYS)
        self.fields["ends_at"].help_text = f"In {timezone.get_current_timezone_name()}."


class ChangeEndForm(forms.Form):
    ends_at = TrialEndField(label="New end")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["ends_at"].help_text = f"In {timezone.get_current_timezone_name()}."
