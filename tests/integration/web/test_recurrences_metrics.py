"""Recurrences on /metrics and the dashboard: counts by state, the planner's lag, the next 24 hours."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from scheduling import api
from scheduling.recurring import planner
from scheduling.web import dashboard, metrics

pytestmark = [pytest.mark.django_db, pytest.mark.filterwarnings("ignore:No directory at:UserWarning")]


def scrape() -> str:
    metrics.forget_cached()
    return metrics.exposition().decode()


def test_metrics_count_states_and_planner_lag(run_sql: Any):
    """States are counted; an occurrence that left pending without a successor is lag until the planner runs."""
    ids = [api.recur("demo.noop", {}, key=f"k{i}", every=3600).id for i in range(3)]
    api.pause_recurrence(ids[2])
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'done', finished_at = now(), due_at = due_at - interval '2 hours',"
        " occurrence_at = occurrence_at - interval '2 hours' WHERE recurrence_id = %s",
        [ids[0]],
    )
    run_sql("UPDATE scheduling_recurrence SET current_at = current_at - interval '2 hours' WHERE id = %s", [ids[0]])
    text = scrape()
    assert 'timekeeper_recurrences{state="active"} 2.0' in text
    assert 'timekeeper_recurrences{state="paused"} 1.0' in text
    assert "timekeeper_recurrence_planner_lag_recurrences 1.0" in text
    assert planner.plan_once().created == 1
    assert "timekeeper_recurrence_planner_lag_recurrences 0.0" in scrape()


def test_dashboard_next_24_hours_counts_recurrence_occurrences():
    """The next-24-hours totals count the recurrences' pending occurrences due within the horizon."""
    api.recur("demo.noop", {}, key="soon", every=600)
    api.recur("demo.noop", {}, key="later", every=600, starts_at=timezone.now() + dt.timedelta(days=30))
    outlook = dashboard.gather()["next24"]["recurrences"]
    assert outlook["active"] == 2
    assert outlook["occurrences"] == 1
    assert dashboard.gather()["next24"]["jobs"] >= outlook["occurrences"]
