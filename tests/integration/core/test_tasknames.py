"""Messages on the real broker carry readable names (Celery's shadow header) for Flower and worker logs."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis
from django.conf import settings

from scheduling import api
from scheduling.core import tasknames
from scheduling.due_at import claim

pytestmark = pytest.mark.django_db

PREFIX = getattr(settings, "CELERY_BROKER_KEYPREFIX", "")  # this test run's keys on the shared Redis


def queued(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """(headers, args, kwargs) of every message waiting in ``queue``."""
    out = []
    for raw in client.lrange(f"{PREFIX}{queue}", 0, -1):
        message = json.loads(raw)
        args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        out.append({"headers": message["headers"], "args": args, "kwargs": kwargs})
    return out


def test_a_due_at_batch_is_named_by_its_kind(broker):
    """claim_and_dispatch sends scheduling.run_batch messages shown as batch:<kind> (the kind's name is its jobs')."""
    api.schedule("reminders.trial_ending", {"user_id": 1, "trial_id": 2}, delay=0)
    api.schedule("demo.noop", {}, delay=0)
    report = claim.claim_and_dispatch()
    assert report.claimed == 2
    messages = queued(broker, settings.CELERY_TASK_DEFAULT_QUEUE)
    names = sorted((m["headers"]["task"], m["headers"]["shadow"]) for m in messages)
    assert names == [
        ("scheduling.run_batch", "batch:demo.noop"),
        ("scheduling.run_batch", "batch:reminders.trial_ending"),
    ]


def test_a_broker_deferral_is_named_by_its_kind(broker, django_capture_on_commit_callbacks):
    """A short deferral's scheduling.run_deferred message shows as the kind it runs."""
    with django_capture_on_commit_callbacks(execute=True):
        api.defer("demo.record", {"label": "soon"}, 30)
    messages = [m for q in ("timekeeper.deferred", settings.CELERY_TASK_DEFAULT_QUEUE) for m in queued(broker, q)]
    assert [(m["headers"]["task"], m["headers"]["shadow"]) for m in messages] == [
        ("scheduling.run_deferred", "demo.record")
    ]


@pytest.mark.parametrize(
    ("task", "args", "kwargs", "name"),
    [
        ("scheduling.run_fixed", [], {"schedule": "nightly", "tick": None}, "fixed:nightly"),
        ("scheduling.run_fixed", ["nightly"], {}, "fixed:nightly"),
        ("scheduling.run_deferred", ["payments.retry", {}, 1, "id"], {}, "payments.retry"),
        ("scheduling.run_deferred", [], {}, None),
        ("scheduling.claim", [], {}, None),
    ],
)
def test_shadow_names_from_arguments(task, args, kwargs, name):
    """Deferrals are named by their kind argument, fixed runs by their schedule; other tasks keep their name."""
    assert tasknames.shadow_for(task, args, kwargs) == name
