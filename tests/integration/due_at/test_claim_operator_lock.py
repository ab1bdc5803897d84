"""The claim never waits on an operator's transaction (issue 34 item 6)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from scheduling import api
from scheduling.due_at import store

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_open_transaction_on_a_capped_kinds_control_row_does_not_stop_claiming_another_kind():
    """An operator's transaction holding a capped kind's control row: another kind's due jobs are claimed meanwhile."""
    api.set_max_running("demo.fail", 3)
    ids = {api.schedule("demo.record", {"label": "other kind"}, delay=0).id for _ in range(3)}
    held, release, claimed, outcome = threading.Event(), threading.Event(), threading.Event(), {}

    def operator() -> None:
        try:
            with transaction.atomic():
                api.resume("demo.fail")  # updates (row-locks) the capped kind's control row
                held.set()
                release.wait(10)  # an operator's transaction left open (the issue saw 40 s)
        finally:
            connection.close()

    def claimer() -> None:
        try:
            outcome["ids"] = {c.id for c in store.claim_due_jobs(100)}
            outcome["while_held"] = not release.is_set()
            claimed.set()
        finally:
            connection.close()

    op = threading.Thread(target=operator)
    op.start()
    assert held.wait(10)
    cl = threading.Thread(target=claimer)
    cl.start()
    claimed.wait(10)
    release.set()
    op.join(15)
    cl.join(15)
    assert outcome.get("ids") == ids
    assert outcome["while_held"], "the claim waited for the operator's transaction to end"
