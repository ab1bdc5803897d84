"""The API lists' pages (scheduling/web/paging.py): keyset cursors, a capped page depth and a capped count.

Issue 33 finding 10: ``GET /api/jobs/?page=1500&page_size=200`` over an owner's 300,000 finished jobs
cost an ``OFFSET`` of 299,800 rows and a ``COUNT`` of all of them on every request. Here a deep
page number is refused before any SQL, a cursor page reads an index range, and the count stops at
``MAX_COUNT``; the statements themselves are checked.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling import api
from scheduling.models import ScheduledJob
from scheduling.web import paging

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

JOBS = "/api/jobs/"
RECURRENCES = "/api/recurrences/"


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _jobs(owner: Any, n: int, *, start: int = 600, ties: int = 3) -> list[int]:
    """``n`` pending jobs of ``owner``, ``ties`` of them sharing each due time (the id breaks the tie)."""
    base = timezone.now() + dt.timedelta(seconds=start)
    return [
        api.schedule("demo.noop", {}, due_at=base + dt.timedelta(seconds=i // ties), owner=owner).id for i in range(n)
    ]


def _walk(client: Client, url: str, params: dict[str, Any], between: Any = None) -> list[dict[str, Any]]:
    """Every page reached by following ``next`` from ``url``; ``between(i)`` runs after page ``i``."""
    pages = []
    body = client.get(url, params).json()
    while True:
        pages.append(body)
        if between is not None:
            between(len(pages))
        if body["next"] is None:
            return pages
        body = client.get(body["next"]).json()


def _statements(context: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in context.captured_queries]


def _assert_bounded(statements: list[str]) -> None:
    """No OFFSET past the page-number bound, and every count over a LIMITed subquery."""
    for sql in statements:
        for offset in re.findall(r"OFFSET (\d+)", sql):
            assert int(offset) <= paging.MAX_OFFSET_ROWS, sql
        if "COUNT(" in sql.upper():
            assert re.search(rf"LIMIT {paging.MAX_COUNT + 1}\b", sql), sql


def test_a_page_number_past_the_depth_bound_is_refused_before_any_read(alice):
    """page=1500&page_size=200 is 400 page_too_deep, naming cursor, and reads neither an OFFSET nor a count."""
    _jobs(alice, 5)
    client = logged_in(alice)
    with CaptureQueriesContext(connection) as context:
        response = client.get(JOBS, {"page": 1500, "page_size": 200})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["max_offset_rows"]) == ("page_too_deep", paging.MAX_OFFSET_ROWS)
    assert "cursor" in error["message"]
    jobs_sql = [s for s in _statements(context) if "scheduling_scheduledjob" in s]
    assert jobs_sql == []


def test_the_deepest_allowed_page_number_still_answers(alice):
    """A page starting at exactly MAX_OFFSET_ROWS is served (404 past the last page), one row deeper is 400."""
    _jobs(alice, 3)
    client = logged_in(alice)
    deepest = paging.MAX_OFFSET_ROWS // 200 + 1
    assert client.get(JOBS, {"page": deepest, "page_size": 200}).status_code == 404
    assert client.get(JOBS, {"page": deepest + 1, "page_size": 200}).status_code == 400


def test_cursor_pages_read_no_offset_and_a_bounded_count(alice):
    """Following next links: every page after the first reads from its cursor, never OFFSET, count LIMITed."""
    ids = _jobs(alice, 23)
    client = logged_in(alice)
    first = client.get(JOBS, {"page_size": 5}).json()
    assert (first["count"], first["count_exact"], first["pages"], first["page"]) == (23, True, 5, 1)
    assert "cursor=" in first["next"]
    with CaptureQueriesContext(connection) as context:
        second = client.get(first["next"]).json()
        third = client.get(second["next"]).json()
    statements = [s for s in _statements(context) if "scheduling_scheduledjob" in s]
    assert statements, "the pages were read"
    assert not any("OFFSET" in s for s in statements), statements
    _assert_bounded(statements)
    assert (second["page"], second["previous"], third["count"]) == (None, None, 23)
    walked = [j["id"] for page in (first, second, third) for j in page["results"]]
    assert walked == ids[:15]


def test_the_count_stops_at_its_bound_and_says_so(alice, monkeypatch):
    """Past MAX_COUNT rows: count is MAX_COUNT, count_exact false, pages null; next links still reach every row."""
    monkeypatch.setattr(paging, "MAX_COUNT", 4)
    monkeypatch.setattr(paging, "MAX_OFFSET_ROWS", 4)
    ids = _jobs(alice, 9)
    client = logged_in(alice)
    with CaptureQueriesContext(connection) as context:
        body = client.get(JOBS, {"page_size": 2}).json()
    assert (body["count"], body["count_exact"], body["pages"]) == (4, False, None)
    _assert_bounded(_statements(context))
    pages = _walk(client, JOBS, {"page_size": 2})
    assert [j["id"] for page in pages for j in page["results"]] == ids
    assert client.get(JOBS, {"page": 3, "page_size": 2}).status_code == 200
    assert client.get(JOBS, {"page": 4, "page_size": 2}).json()["error"]["code"] == "page_too_deep"


@pytest.mark.django_db(transaction=True)
def test_cursor_pages_are_disjoint_and_complete_while_jobs_are_inserted(alice, raw_connect):
    """Rows committed by another connection between pages (before, at, after the cursor): no repeat, no gap."""
    ids = _jobs(alice, 40)
    other = raw_connect(autocommit=True)

    copied = ", ".join(f.column for f in ScheduledJob._meta.concrete_fields if f.column not in {"id", "due_at", "key"})

    def insert_elsewhere(page: int) -> None:
        with other.cursor() as cursor:  # one row due before everything, one tied with the middle, one after
            for seconds in (-60, 6, 3600):
                cursor.execute(
                    f"INSERT INTO scheduling_scheduledjob (due_at, {copied}) SELECT due_at"  # noqa: S608 (model's columns)
                    f" + make_interval(secs => %s), {copied} FROM scheduling_scheduledjob WHERE id = %s",
                    [seconds, ids[0]],
                )

    pages = _walk(logged_in(alice), JOBS, {"page_size": 7}, between=insert_elsewhere)
    walked = [j["id"] for page in pages for j in page["results"]]
    assert len(walked) == len(set(walked)), "no job is listed twice"
    assert set(ids) <= set(walked), "every job present at the start is listed"
    due = [(j["due_at"], j["id"]) for page in pages for j in page["results"]]
    assert due == sorted(due)


def test_a_bad_cursor_is_a_400_and_page_with_cursor_too(alice):
    """A cursor this API did not sign, or one given with page, is 400; nothing reaches the database as a cursor."""
    _jobs(alice, 3)
    client = logged_in(alice)
    first = client.get(JOBS, {"page_size": 1}).json()
    cursor = first["next"].split("cursor=")[1]
    for bad in ("abc", cursor[:-2] + "xx", "x" * 400):
        response = client.get(JOBS, {"cursor": bad})
        assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_cursor")
    both = client.get(JOBS, {"cursor": "abc", "page": 1})
    assert both.status_code == 400


def test_a_jobs_cursor_page_reads_the_owner_due_index_without_sorting(alice):
    """The cursor page's statement can walk scheduledjob_owner_due_idx in order: its plan needs no Sort."""
    _jobs(alice, 12)
    client = logged_in(alice)
    first = client.get(JOBS, {"page_size": 4}).json()
    with CaptureQueriesContext(connection) as context:
        client.get(first["next"])
    (select,) = [s for s in _statements(context) if "scheduling_scheduledjob" in s and "ORDER BY" in s]
    with connection.cursor() as cursor:
        # Few rows and stale statistics make any plan cheap: forbid the table scan and the sort, and see
        # whether an index still gives the rows in order (without one PostgreSQL sorts anyway).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(f"EXPLAIN {select}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "scheduledjob_owner_due_idx" in plan, plan
    assert "Sort" not in plan, plan


def test_recurrence_pages_follow_a_cursor_too(alice):
    """The recurrences list pages by id with next links: complete, disjoint, no OFFSET, a bounded count."""
    made = [api.recur("demo.noop", {}, key=f"r{i}", cron="0 9 * * *", owner=alice).id for i in range(11)]
    client = logged_in(alice)
    with CaptureQueriesContext(connection) as context:
        pages = _walk(client, RECURRENCES, {"page_size": 4})
    assert [r["id"] for page in pages for r in page["results"]] == made
    assert (pages[0]["count"], pages[0]["count_exact"], pages[0]["pages"]) == (11, True, 3)
    statements = [s for s in _statements(context) if "scheduling_recurrence" in s]
    assert not any("OFFSET" in s for s in statements), statements
    _assert_bounded(statements)
    deep = client.get(RECURRENCES, {"page": 1500, "page_size": 200})
    assert deep.json()["error"]["code"] == "page_too_deep"
