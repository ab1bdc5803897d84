"""The jobs list's triage against real PostgreSQL: error columns and classes, payload search, times, counts, links."""

from __future__ import annotations

import re

import psycopg2
import pytest
from django.db import connection
from django.db.models.functions import Now

from scheduling import api, testing
from scheduling.due_at import store as jobs_store
from scheduling.models import ScheduledJob
from scheduling.web.admin import jobs as jobs_admin
from tests import support

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

URL = "/admin/scheduling/scheduledjob/"


def _ids(page: str) -> list[int]:
    """The job ids the list shows, in order."""
    return [int(i) for i in re.findall(r'<th class="field-id"><a href="[^"]*/(\d+)/change/', page)]


def _fail_with(error: str, *, kind: str = "demo.noop") -> ScheduledJob:
    """A dead job whose last error is ``error``."""
    job = api.schedule(kind, {}, delay=3600)
    ScheduledJob.objects.filter(pk=job.pk).update(state="dead", last_error=error, finished_at=Now(), attempts=1)
    return job


def test_the_list_shows_the_error_class_and_the_last_error(admin_client):
    """A failed job's row names its error class (a link to the others like it) and its last error's first line."""
    job = _fail_with("ValueError: the account 42 has no plan\nmore detail")
    page = admin_client.get(URL).content.decode()
    row = page[page.index(f"/{job.pk}/change/") :]
    row = row[: row.index("</tr>")]
    assert 'class="tk-error-class" href="/admin/scheduling/scheduledjob/?error_class=ValueError">ValueError</a>' in row
    assert ">the account 42 has no plan</span>" in row  # the class is in its own column
    assert 'title="ValueError: the account 42 has no plan\nmore detail"' in row


def test_the_error_class_filter_groups_the_commonest_classes_with_counts(admin_client):
    """The filter lists error classes with counts, commonest first, and each narrows the list to its jobs."""
    a, b = _fail_with("ValueError: one"), _fail_with("ValueError: two")
    c = _fail_with("claim expired: the worker stopped heartbeating")
    ok = api.schedule("demo.noop", {}, delay=3600)
    page = admin_client.get(URL).content.decode()
    assert page.index("ValueError (2)") < page.index("claim expired (1)")
    assert sorted(_ids(admin_client.get(URL, {"error_class": "ValueError"}).content.decode())) == [a.pk, b.pk]
    assert _ids(admin_client.get(URL, {"error_class": "claim expired"}).content.decode()) == [c.pk]
    anything = _ids(admin_client.get(URL, {"error_class": "*"}).content.decode())
    assert ok.pk not in anything
    assert sorted(anything) == [a.pk, b.pk, c.pk]


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("user_id=5", ["five"]),
        ("user_id=55", []),
        ("account.plan=gold", ["nested"]),
        ('account.plan="gold"', ["nested"]),
        ("user-5", ["text"]),
        ('$.tags[*] ? (@ == "vip")', ["five"]),
    ],
)
def test_payload_search_by_field_value_or_json_path(admin_client, term, expected):
    """?q= finds jobs by payload: a field (JSON containment, dotted for nested), a value anywhere, a JSON path."""
    jobs = {
        "five": api.schedule("demo.noop", {"user_id": 5, "tags": ["vip"]}, delay=3600),
        "fifty": api.schedule("demo.noop", {"user_id": 50}, delay=3600),
        "nested": api.schedule("demo.noop", {"account": {"plan": "gold"}}, delay=3600),
        "text": api.schedule("demo.noop", {"user": "user-5"}, delay=3600),
    }
    found = _ids(admin_client.get(URL, {"q": term}).content.decode())
    assert sorted(found) == sorted(jobs[name].pk for name in expected)


def test_a_json_path_that_does_not_parse_is_a_message_not_an_error_page(admin_client):
    """A broken JSON path shows a message and an empty list, with status 200."""
    api.schedule("demo.noop", {"user_id": 5}, delay=3600)
    response = admin_client.get(URL, {"q": "$.user_id ? (@ =="})
    assert response.status_code == 200
    page = response.content.decode()
    assert "Not a JSON path" in page
    assert _ids(page) == []


def test_payload_containment_is_served_by_the_payload_index(run_sql):
    """The containment the search sends can use scheduledjob_payload_gin (migration 0027): no scan of the table."""
    api.schedule("demo.noop", {"user_id": 5}, delay=3600)
    sql, params = ScheduledJob.objects.filter(payload__contains={"user_id": 5}).values("id").query.sql_with_params()
    run_sql("SET LOCAL enable_seqscan = off")
    plan = "\n".join(row[0] for row in run_sql(f"EXPLAIN {sql}", params))
    assert "scheduledjob_payload_gin" in plan


@pytest.mark.django_db(transaction=True)
def test_a_search_that_runs_too_long_is_stopped_and_says_so(admin_client, monkeypatch):
    """A search past the statement timeout is cancelled; the list comes back without it and says why."""
    api.schedule("demo.noop", {"user_id": 5}, delay=3600)
    monkeypatch.setattr(jobs_admin, "SEARCH_TIMEOUT_SECONDS", 0.3)
    blocker = psycopg2.connect(**connection.get_connection_params())
    try:
        with blocker.cursor() as cursor:  # the page's query waits for this lock until its timeout stops it
            cursor.execute("LOCK TABLE scheduling_jobattempt IN ACCESS EXCLUSIVE MODE")
            response = admin_client.get(URL, {"q": "user_id=5", "state__exact": "pending"})
    finally:
        blocker.rollback()
        blocker.close()
    assert response.status_code == 302
    assert response["Location"] == f"{URL}?state__exact=pending"
    assert (
        "The search took longer than 0.3 s and was stopped" in admin_client.get(response["Location"]).content.decode()
    )


def test_started_and_duration_come_from_the_latest_attempt(admin_client):
    """A finished job shows when its latest attempt started and how long it ran; a job never run shows dashes."""
    done = api.schedule("demo.noop", {}, delay=0)
    support.make_due()
    testing.run_due()
    waiting = api.schedule("demo.noop", {}, delay=3600)
    page = admin_client.get(URL).content.decode()

    def cells(job_id: int) -> tuple[str, str]:
        row = page[page.index(f"/{job_id}/change/") :]
        row = row[: row.index("</tr>")]
        started = re.search(r'<td class="field-started">(.*?)</td>', row, re.S)
        duration = re.search(r'<td class="field-duration">(.*?)</td>', row, re.S)
        assert started
        assert duration
        return re.sub(r"<[^>]+>", "", started.group(1)), re.sub(r"<[^>]+>", "", duration.group(1))

    started, duration = cells(done.pk)
    assert re.fullmatch(r"\d\d:\d\d:\d\d", started)
    assert re.fullmatch(r"\d+ ms|\d+\.\d s", duration)
    assert cells(waiting.pk) == ("-", "-")


def test_a_running_claim_shows_when_it_was_claimed_and_how_long_it_has_run(admin_client, run_sql):
    """A claim a worker has started shows its claim time as started and a duration so far, marked with "…"."""
    job = api.schedule("demo.noop", {}, delay=0)
    support.make_due()
    jobs_store.claim_due_jobs(1)
    run_sql(
        "UPDATE scheduling_scheduledjob SET state = 'running', claimed_by = 'host:1', "
        "claimed_at = now() - interval '90 seconds' "
        "WHERE id = %s",
        [job.pk],
    )
    page = admin_client.get(URL).content.decode()
    row = page[page.index(f"/{job.pk}/change/") :]
    row = row[: row.index("</tr>")]
    duration = re.search(r'<td class="field-duration">(.*?)</td>', row, re.S)
    assert duration
    assert re.fullmatch(r"1 min \d+ s …", re.sub(r"<[^>]+>", "", duration.group(1)))  # 90 s and counting
    assert re.search(r'<td class="field-started"><span class="tk-when" title="[^"]+">\d\d:\d\d:\d\d</span>', row)


def test_per_state_counts_show_above_the_list_without_show_counts(admin_client, monkeypatch):
    """Each state's count shows above the list, linked to the state's filter, capped past the limit."""
    api.schedule_many("demo.noop", [{}, {}, {}], delay=3600)
    _fail_with("ValueError: x")
    page = admin_client.get(URL).content.decode()
    counts = dict(
        re.findall(
            r'<li data-state="(\w+)"><a href="[^"]+"><span[^>]*>\w+</span> <span class="tk-count">([^<]+)<', page
        )
    )
    assert counts == {"pending": "3", "claimed": "0", "running": "0", "done": "0", "cancelled": "0", "dead": "1"}
    assert 'href="/admin/scheduling/scheduledjob/?state__exact=dead"' in page
    monkeypatch.setattr(jobs_admin, "STATE_COUNT_CAP", 2)
    page = admin_client.get(URL).content.decode()
    assert '<span class="tk-count">2+<' in page


def test_an_occurrence_links_to_its_recurrence_and_the_recurrence_lists_its_runs(admin_client):
    """A recurrence's job links to the recurrence, in the list and on its page; ?recurrence= lists its jobs."""
    recurrence = api.recur("demo.noop", {}, key="digest", every=3600)
    other = api.schedule("demo.noop", {}, delay=3600)
    occurrence = ScheduledJob.objects.get(recurrence_id=recurrence.pk)
    link = f'href="/admin/scheduling/recurrence/{recurrence.pk}/change/"'
    assert link in admin_client.get(URL).content.decode()
    assert link in admin_client.get(f"{URL}{occurrence.pk}/change/").content.decode()
    listed = _ids(admin_client.get(URL, {"recurrence": recurrence.pk}).content.decode())
    assert listed == [occurrence.pk]
    assert other.pk not in listed
