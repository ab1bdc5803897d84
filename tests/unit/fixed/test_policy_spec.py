"""The fixed-time policy spec: one list of fields drives the declaration, the sync, the admin form and the check."""

from __future__ import annotations

import dataclasses

import pytest

from scheduling import exceptions, schedules
from scheduling.fixed import spec
from scheduling.models import SchedulePolicy
from scheduling.web.admin import fixed_forms as admin_forms

POLICY_FIELDS = {
    "kind", "payload", "concurrency_policy", "starting_deadline_seconds", "active_deadline_seconds",
    "backoff_limit", "successful_history_limit", "failed_history_limit", "missed_policy",
    "missed_window_seconds", "dst_gap",
}  # fmt: skip


def test_every_spec_field_is_a_policy_column_with_the_columns_default():
    """Each spec field names a SchedulePolicy column, and its default is that column's (written once, in the model)."""
    assert set(spec.PolicySpec.names()) == POLICY_FIELDS
    defaults = spec.PolicySpec(kind="demo.noop")
    for name in spec.PolicySpec.names():
        column = SchedulePolicy._meta.get_field(name)
        if name != "kind":
            assert getattr(defaults, name) == column.get_default(), name  # type: ignore[union-attr]


def test_the_declaration_the_form_and_the_fieldsets_carry_every_spec_field():
    """Declaration is a PolicySpec; the admin form and the inline's fieldsets list each spec field exactly once."""
    declaration_fields = {field.name for field in dataclasses.fields(schedules.Declaration)}
    assert declaration_fields >= POLICY_FIELDS
    assert set(admin_forms.SchedulePolicyForm.Meta.fields) == POLICY_FIELDS | {"expression"}
    shown = [name for _title, options in admin_forms.policy_fieldsets(("anchor_at",)) for name in options["fields"]]
    assert sorted(shown) == sorted([*POLICY_FIELDS, "expression", "timezone", "every_seconds", "anchor_at"])


def test_make_takes_each_spec_field_and_refuses_others():
    """declare()/make() accept every policy field as a keyword; an unknown one is a named error listing the fields."""
    declaration = schedules.make(name="s", kind="demo.noop", every=60, backoff_limit=2, missed_policy="run_once")
    assert spec.PolicySpec.of(declaration) == spec.PolicySpec(
        kind="demo.noop", backoff_limit=2, missed_policy="run_once"
    )
    assert spec.PolicySpec.of(declaration.columns()) == spec.PolicySpec.of(declaration)
    with pytest.raises(exceptions.InvalidPolicy, match=r"unknown argument.*retries.*backoff_limit"):
        schedules.make(name="s", kind="demo.noop", every=60, retries=2)
    with pytest.raises(exceptions.InvalidPolicy, match="kind= is required"):
        schedules.make(name="s", every=60)
