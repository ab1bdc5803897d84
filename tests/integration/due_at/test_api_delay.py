"""``delay`` counts from the call by the database clock (``clock_timestamp()``), even in a long transaction."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from scheduling import api
from scheduling.due_at import store
from scheduling.models import ScheduledJob

pytestmark = pytest.mark.django_db(transaction=True)

DELAY = 600.0
OPEN_FOR = 0.3  # seconds the transaction has been open (pg_sleep) before the call


def _clock() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _existing(key: str | None = None) -> int:
    return api.schedule("demo.noop", {}, delay=5 * DELAY, key=key).id


CALLS: dict[str, Callable[[int], list[int]]] = {
    "schedule": lambda _: [api.schedule("demo.noop", {}, delay=DELAY).id],
    "schedule_many": lambda _: api.schedule_many("demo.noop", [{}, {}], delay=DELAY),
    "schedule_key_new": lambda _: [api.schedule("demo.noop", {}, delay=DELAY, key="delay:new").id],
    "schedule_key_replace": lambda _: [api.schedule("demo.noop", {"v": 2}, delay=DELAY, key="delay:old").id],
    "reschedule": lambda job_id: [job_id] if api.reschedule(job_id, delay=DELAY) else [],
    "reschedule_many": lambda job_id: list(api.reschedule_many([job_id], delay=DELAY).changed),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_delay_counts_from_the_call_not_the_transactions_start(call):
    """In a transaction open for a while, due_at is the delay after the clock at the call (between before and after)."""
    job_id = _existing(key="delay:old")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [OPEN_FOR])
        before = _clock()
        ids = CALLS[call](job_id)
        after = _clock()
    assert ids
    for due_at in ScheduledJob.objects.filter(pk__in=ids).values_list("due_at", flat=True):
        assert before + dt.timedelta(seconds=DELAY) <= due_at <= after + dt.timedelta(seconds=DELAY), call


def test_delay_zero_is_due_for_a_claim_in_the_same_transaction():
    """delay=0 means due at once: a claim inside the same (long) transaction, as in a TestCase, takes the job."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [OPEN_FOR])
        job = api.schedule("demo.noop", {}, delay=0)
        keyed = api.schedule("demo.noop", {}, delay=0, key="delay:zero")
        assert sorted(c.id for c in store.claim_due_jobs(10)) == sorted([job.id, keyed.id])
