"""``manage.py timekeeper recurrences``: create, list, next, pause, resume, cancel, and bad input as CommandError."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from scheduling import api
from scheduling.models import Recurrence, RecurrenceState

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("timekeeper", "recurrences", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_create_list_next_and_state_changes():
    """create stores a recurrence; list and next show it; pause, resume and cancel change its state."""
    assert "next occurrence" in run(
        "create", "demo.noop", "--key", "d:1", "--cron", "0 9 * * *", "--timezone", "Asia/Tokyo"
    )
    rec = Recurrence.objects.get(key="d:1")
    listed = json.loads(run("list", "--json", "--timezone", "Asia/Tokyo"))
    assert [row["id"] for row in listed] == [rec.id]
    assert len(run("next", str(rec.id), "-n", "3").split()) == 3
    assert "Paused 1" in run("pause", str(rec.id))
    assert "Resumed 1" in run("resume", str(rec.id))
    assert "Cancelled 1" in run("cancel", str(rec.id))
    assert Recurrence.objects.get(pk=rec.id).state == RecurrenceState.CANCELLED


@pytest.mark.parametrize(
    "args",
    [
        ("create", "demo.noop", "--key", "k", "--cron", "0 99 * * *"),
        ("create", "demo.noop", "--key", "k", "--cron", "0 9 * * *", "--timezone", "Nowhere/X"),
        ("create", "demo.noop", "--key", "k", "--cron", "0 9 * * *", "--payload", "{bad"),
        ("create", "demo.noop", "--key", "k", "--cron", "0 9 * * *", "--owner", "nobody"),
        ("pause", "999999"),
    ],
)
def test_bad_input_is_a_command_error(args):
    """A bad expression, zone, payload, owner or id is a CommandError and stores nothing."""
    with pytest.raises(CommandError):
        run(*args)
    assert Recurrence.objects.count() == 0


def test_cancelled_cannot_resume():
    """Resuming a cancelled recurrence changes nothing and says so."""
    rec = api.recur("demo.noop", {}, key="k", every=60)
    api.cancel_recurrence(rec.id)
    with pytest.raises(CommandError, match="No recurrence was changed"):
        run("resume", str(rec.id))
