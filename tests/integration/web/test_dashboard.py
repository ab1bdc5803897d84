"""The admin dashboard tells the truth: claimed-but-waiting work, paused apart, per-kind rows, ranges, refresh."""

from __future__ import annotations

import re

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling import api, testing
from scheduling import tasks as celery_tasks
from scheduling.deferrals import countdowns
from scheduling.due_at import claim
from scheduling.due_at import store as jobs_store
from scheduling.models import SchedulePolicy
from scheduling.web import dashboard
from scheduling.web import store as web_store
from tests import support

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

FRAGMENT = "/admin/scheduling/scheduledjob/dashboard/"


def _card(page: str, metric: str) -> str:
    start = page.index(f'data-metric="{metric}"')
    value = page.index('class="tk-value">', start) + len('class="tk-value">')
    return page[value : page.index("</span>", value)].strip()


def _kind_row(page: str, kind: str) -> list[str]:
    row = re.search(rf'<tr data-kind="{re.escape(kind)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {kind}"
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td>(.*?)</td>", row.group(1), re.S)]


def test_backlog_counts_claimed_jobs_no_worker_started(admin_client, run_sql):
    """Jobs claimed but not started are waiting work: the backlog card and the kind's row count them."""
    api.schedule_many("demo.noop", [{}, {}, {}], delay=0)
    support.make_due()
    jobs_store.claim_due_jobs(2)
    page = admin_client.get(FRAGMENT).content.decode()
    assert _card(page, "backlog") == "3"
    assert "1 pending · 2 claimed, waiting" in page
    assert _kind_row(page, "demo.noop")[:3] == ["demo.noop", "1", "2"]


def test_backlog_counts_a_claimed_job_once_though_its_batch_waits_on_the_broker(admin_client, run_sql, broker):
    """Claimed jobs whose batch message waits in the queue count once; another visible message adds one."""
    api.schedule_many("demo.noop", [{}, {}, {}], delay=0)
    support.make_due()
    report = claim.claim_and_dispatch(limit=2)
    assert (report.claimed, report.batches) == (2, 1)
    celery_tasks.sweep.apply_async()  # a visible message that is not a batch
    counts = countdowns.broker_counts()
    assert counts is not None
    assert (counts["visible"], counts["visible_batches"]) == (2, 1)
    page = admin_client.get(FRAGMENT).content.decode()
    assert _card(page, "backlog") == "4", "1 pending + 2 claimed + 1 other message, not + the batch again"
    assert "1 pending · 2 claimed, waiting · 1 more on the broker" in " ".join(page.split())


def test_paused_work_is_shown_apart_from_the_backlog(admin_client, run_sql):
    """A paused kind's due jobs leave the backlog card and appear in the paused card and the kind's row."""
    api.schedule_many("demo.noop", [{}, {}], delay=0)
    support.make_due()
    api.pause("demo.noop")
    page = admin_client.get(FRAGMENT).content.decode()
    assert (_card(page, "backlog"), _card(page, "paused")) == ("0", "2")
    assert _kind_row(page, "demo.noop")[4] == "paused"
    assert ">paused</text>" in page  # the waiting chart draws paused work as its own series


def test_the_fragment_follows_the_range_and_needs_job_view_permission(admin_client, client, django_user_model):
    """?range=15m|1h|6h|24h picks the history window (unknown: 1 h); staff without job permissions get 403."""
    assert 'data-range="24h" aria-current="true"' in admin_client.get(f"{FRAGMENT}?range=24h").content.decode()
    assert 'data-range="1h" aria-current="true"' in admin_client.get(f"{FRAGMENT}?range=nope").content.decode()
    assert "-24 h" in admin_client.get(f"{FRAGMENT}?range=24h").content.decode()
    client.force_login(django_user_model.objects.create_user("clerk", password="pw", is_staff=True))
    assert client.get(FRAGMENT).status_code == 403


def test_the_index_page_refreshes_its_body_from_the_fragment(admin_client):
    """The admin index carries the fragment's URL and the script that fetches it; nothing loads from elsewhere."""
    page = admin_client.get("/admin/?range=6h").content.decode()
    assert f'data-refresh-url="{FRAGMENT}"' in page
    assert 'data-range="6h"' in page
    assert "fetch(url" in page
    assert not re.search(r'(src|href)="(https?:)?//', page)


def test_an_every_minute_schedule_does_not_swamp_the_next_24_hours(admin_client):
    """A schedule firing every minute is named under the chart and left out of its bars."""
    every = IntervalSchedule.objects.create(every=60, period=IntervalSchedule.SECONDS)
    task = PeriodicTask.objects.create(name="every-minute", task="scheduling.run_fixed", interval=every)
    SchedulePolicy.objects.create(periodic_task=task, kind="demo.record")
    data = dashboard.gather("1h")
    assert [f.name for f in data["next24"]["frequent"]] == ["every-minute"]
    assert "fixed-time ticks:" not in str(data["next24_chart"])
    page = admin_client.get(FRAGMENT).content.decode()
    assert "not drawn: every-minute (1440 ticks)" in page


def test_waiting_history_keeps_a_claim_waiting_until_a_worker_starts_it(run_sql):
    """A job claimed ten minutes ago and never started is still waiting at every sample since its due time."""
    api.schedule("demo.noop", {}, delay=0)
    support.make_due(ago="20 minutes")
    run_sql("UPDATE scheduling_scheduledjob SET created_at = now() - interval '20 minutes'")  # made 20 min ago
    jobs_store.claim_due_jobs(1)
    run_sql("UPDATE scheduling_scheduledjob SET claimed_at = now() - interval '10 minutes'")
    history = web_store.waiting_history(900, 15)
    assert [p.waiting for p in history] == [1] * 16


def test_a_job_scheduled_into_the_past_waits_only_from_its_creation(run_sql):
    """A job created now but due two hours ago is waiting at the last sample only, not across the whole hour."""
    api.schedule("demo.noop", {}, delay=0)
    support.make_due(ago="2 hours")
    history = web_store.waiting_history(3600, 60)
    assert [p.waiting for p in history][-1] == 1
    assert sum(p.waiting for p in history[:-1]) == 0


def test_a_backdated_job_does_not_put_the_lag_at_hours(run_sql):
    """The lag of a job created now but due two days ago counts from its creation: seconds, not 48 h."""
    api.schedule("demo.noop", {}, delay=0)
    support.make_due(ago="2 days")
    assert testing.run_due().succeeded == 1
    overall, _buckets = web_store.attempt_lag_buckets(3600, 60)
    assert overall is not None
    assert overall.p99 < 60
    histogram = web_store.attempt_lag_histogram(3600, [1.0, 60.0, 3600.0])
    assert [b.bucket for b in histogram] in ([0], [1]), "under a minute: the first buckets, not past the hour"


def test_a_count_past_the_exact_limit_is_marked_as_an_estimate(admin_client, settings):
    """Above the exact limit the pending card shows the planner's estimate with "≈"; an exact count has none."""
    api.schedule_many("demo.noop", [{}, {}, {}], delay=3600)
    page = admin_client.get(FRAGMENT).content.decode()
    assert _card(page, "pending") == "3"
    settings.SCHEDULING_STATUS_EXACT_LIMIT = 2
    page = admin_client.get(FRAGMENT).content.decode()
    assert "≈" in _card(page, "pending")
    assert "pending (estimate)" in page


def test_the_finished_chart_counts_succeeded_failed_and_dead_per_kind(admin_client):
    """Outcomes per minute: the chart draws succeeded, failed and dead; the per-kind rows give window and totals."""
    api.schedule_many("demo.noop", [{}, {}], delay=0)
    api.schedule("demo.fail", {}, delay=0, max_attempts=1)
    support.make_due()
    testing.run_due()
    page = admin_client.get(FRAGMENT).content.decode()
    chart = page[page.index('id="tk-finished"') :]
    chart = chart[: chart.index("</figure>")]
    assert "Finished per minute (every kind)" in chart
    for name in ("succeeded", "failed", "dead"):
        assert f">{name}</text>" in chart
    assert chart.count("<polyline") == 3
    assert chart.count('stroke-dasharray="4 3"') == 1  # dead, which lies on failed here
    assert _finished_row(page, "demo.noop") == ["demo.noop", "2", "0", "0", "2", "0", "0"]
    assert _finished_row(page, "demo.fail") == ["demo.fail", "0", "1", "1", "0", "1", "1"]
    one = admin_client.get(f"{FRAGMENT}?kind=demo.fail").content.decode()
    assert "Finished per minute (demo.fail)" in one
    assert "Finished per minute (every kind)" in admin_client.get(f"{FRAGMENT}?kind=nope").content.decode()


def _queue_row(page: str, queue: str) -> list[str]:
    row = re.search(rf'<tr data-finished-queue="{re.escape(queue)}">(.*?)</tr>', page, re.S)
    assert row, f"no finished row for queue {queue}"
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]


def test_the_finished_chart_draws_one_queue_and_the_queues_add_up_their_kinds(admin_client):
    """?queue= charts the kinds of one named queue; the per-queue rows add up their kinds' window counts."""
    api.schedule_many("demo.noop", [{}, {}], delay=0)
    api.schedule("demo.fail", {}, delay=0, max_attempts=1)
    api.schedule("demo.export", {"label": "q"}, delay=0)
    support.make_due()
    testing.run_due()
    page = admin_client.get(FRAGMENT).content.decode()
    assert _queue_row(page, "default") == ["default", "demo.fail, demo.noop", "2", "1", "1"]
    assert _queue_row(page, "exports") == ["exports", "demo.export", "1", "0", "0"]
    one = admin_client.get(f"{FRAGMENT}?queue=exports").content.decode()
    assert "Finished per minute (queue exports)" in one
    assert 'data-finished-queue="exports" aria-current="true"' in one
    assert "Finished per minute (every kind)" in admin_client.get(f"{FRAGMENT}?queue=nope").content.decode()
    both = admin_client.get(f"{FRAGMENT}?kind=demo.fail&queue=exports").content.decode()
    assert "Finished per minute (demo.fail)" in both  # a kind is the narrower choice


def test_the_finished_totals_come_from_the_outcome_counters_and_survive_pruning(admin_client, run_sql):
    """Deleting the history (as the pruner does) empties the window's counts but not the totals."""
    api.schedule("demo.noop", {}, delay=0)
    support.make_due()
    testing.run_due()
    run_sql("DELETE FROM scheduling_jobattempt")
    run_sql("DELETE FROM scheduling_scheduledjob")
    page = admin_client.get(FRAGMENT).content.decode()
    assert _finished_row(page, "demo.noop") == ["demo.noop", "0", "0", "0", "1", "0", "0"]
    assert "nothing finished in this period" in page


def _finished_row(page: str, kind: str) -> list[str]:
    row = re.search(rf'<tr data-finished-kind="{re.escape(kind)}">(.*?)</tr>', page, re.S)
    assert row, f"no finished row for {kind}"
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
