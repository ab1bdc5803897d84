"""A job's SET LOCAL (or set_config(..., true)) in an atomic chunk: its own, not its batch-mates' or the runner's.

A job's savepoint is released, not rolled back, when it succeeds, so what it set with SET LOCAL
lasted to the end of the chunk's transaction: a later job of the chunk failed on its 50 ms
statement_timeout, and after a search_path without the jobs table the runner's own outcome
statement failed, the chunk was lost and the job ran again until it was dead, its handler
succeeding every time. Now the chunk ends after such a job, with what it changed put back first.
"""

from __future__ import annotations

import pytest
from django.db import connection

from scheduling import api, registry
from scheduling.due_at import lease, runner, store
from scheduling.models import JobAttempt, JobState, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[tuple[int, str, str]] = []  # (job id, statement_timeout, search_path) each job saw at its end


def _set_then_query(job: registry.Job) -> None:
    with connection.cursor() as cursor:
        if job.payload.get("set"):
            cursor.execute(job.payload["set"])
            return  # nothing more under its own setting (a 1 ms statement_timeout is its business)
        if job.payload.get("sleep"):
            cursor.execute("SELECT pg_sleep(%s)", [job.payload["sleep"]])
        cursor.execute("SELECT current_setting('statement_timeout'), current_setting('search_path')")
        SEEN.append((job.id, *cursor.fetchone()))


registry.handler("settings.atomic", schema={"type": "object"}, timeout=10, batch_size=10, max_attempts=3)(
    _set_then_query
)


@pytest.fixture(autouse=True)
def _clean():
    SEEN.clear()
    yield
    lease.stop()


def _run(payloads: list[dict]) -> tuple[list[int], runner.BatchReport]:
    ids = api.schedule_many("settings.atomic", payloads, delay=60)
    support.make_due(ids)
    claims = sorted(store.claim_due_jobs(100), key=lambda c: c.id)
    return ids, runner.run_batch([(c.id, c.token) for c in claims])


@pytest.mark.parametrize(
    "setting",
    [
        "SET LOCAL statement_timeout = '50ms'",
        "SELECT set_config('statement_timeout', '50ms', true)",
        "SET LOCAL search_path = pg_catalog",
        "set local search_path to pg_catalog",
        "/* traceparent='00-1-2-01' */ SET LOCAL search_path = pg_catalog",
        "SET LOCAL statement_timeout = 1",
    ],
)
@pytest.mark.parametrize("mate_first", [False, True], ids=["setter-first", "mate-first"])
def test_a_jobs_set_local_reaches_neither_its_batch_mates_nor_the_runner(setting, mate_first):
    """With the search path, the runner's own statements would fail (they did: the job ran again until dead);
    with a 1 ms statement_timeout, the statements putting the settings back would be cancelled themselves."""
    payloads = [{"set": setting}, {"sleep": 0.2}, {}]
    if mate_first:
        payloads.insert(0, {})
    ids, report = _run(payloads)
    states = dict(ScheduledJob.objects.filter(pk__in=ids).values_list("id", "state"))
    assert [states[i] for i in ids] == [JobState.DONE] * len(ids)
    assert (report.succeeded, report.chunks) == (len(ids), 2), "the chunk ends after the job that set something"
    seen = {job_id: (timeout, path) for job_id, timeout, path in SEEN}
    assert seen[ids[-2]] == seen[ids[-1]]
    assert seen[ids[-1]][1] != "pg_catalog"
    assert seen[ids[-1]][0] not in ("50ms", "1ms")
    assert set(JobAttempt.objects.filter(job_id__in=ids).values_list("outcome", flat=True)) == {"succeeded"}


def test_jobs_that_set_nothing_share_their_chunk():
    """The path every other job takes: one chunk, no settings read (UPDATE ... SET is no SET statement)."""
    _, report = _run([{}, {}, {}])
    assert (report.succeeded, report.chunks) == (3, 1)
    assert not runner._changes_settings("UPDATE tasks_execution SET kind = 'x' WHERE id = 1")
    assert not runner._changes_settings("SET CONSTRAINTS ALL IMMEDIATE")
    assert runner._changes_settings("  RESET search_path")
    # keywords in any case (the quick look for "set" before the regexes must not miss one)
    assert runner._changes_settings("sEt LOCAL statement_timeout = '50ms'")
    assert runner._changes_settings("SELECT sET_CONFIG('search_path', 'pg_catalog', true)")
