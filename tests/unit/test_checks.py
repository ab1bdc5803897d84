"""System checks: stable ids for PostgreSQL-only, JSON-only and the delay ceiling."""

from __future__ import annotations

from django.test import override_settings

from scheduling import checks


def _ids(messages):
    return [m.id for m in messages]


def test_postgresql_passes():
    """The configured database is PostgreSQL, so E001 is silent."""
    assert checks.check_database_is_postgresql() == []


def test_json_only_passes_with_project_settings():
    """The project's Celery settings accept and produce JSON only."""
    assert checks.check_json_only() == []


@override_settings(CELERY_ACCEPT_CONTENT=["json", "pickle"])
def test_pickle_accepted_is_an_error():
    """Accepting pickle fails scheduling.E002."""
    assert _ids(checks.check_json_only()) == ["scheduling.E002"]


@override_settings(CELERY_TASK_SERIALIZER="pickle")
def test_pickle_serializer_is_an_error():
    """Producing pickle fails scheduling.E002 too."""
    assert _ids(checks.check_json_only()) == ["scheduling.E002"]


@override_settings(
    SCHEDULING_BROKER_DELAY_MAX_SECONDS=900, CELERY_BROKER_TRANSPORT_OPTIONS={"visibility_timeout": 3600}
)
def test_ceiling_below_visibility_timeout_passes():
    """900 s plus the 300 s margin sits below a 3600 s visibility timeout."""
    assert checks.check_delay_ceiling() == []


@override_settings(
    SCHEDULING_BROKER_DELAY_MAX_SECONDS=3500, CELERY_BROKER_TRANSPORT_OPTIONS={"visibility_timeout": 3600}
)
def test_ceiling_too_close_to_visibility_timeout_fails():
    """A ceiling within the margin of the visibility timeout fails scheduling.E003."""
    assert _ids(checks.check_delay_ceiling()) == ["scheduling.E003"]
