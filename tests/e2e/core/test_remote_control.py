"""A real worker's remote control (scheduling/core/remote_control.py) gives a broker-only party no setting.

Issue 33 finding 11: with only the broker URL, ``celery inspect conf`` read every Django setting
of every worker (SECRET_KEY, FLOWER_BASIC_AUTH in clear). The party here is a bare Celery app
holding nothing but the broker URL (and this run's key prefix); Flower, which needs remote control
for its worker pages, still shows the worker.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from celery import Celery
from django.conf import settings

from scheduling.core import remote_control
from tests.e2e import harness
from tests.e2e.project import test_flower as flower_e2e

pytestmark = pytest.mark.e2e

SECRET = f"zz-secret-key-{os.getpid()}"
FLOWER_PASSWORD = f"zz-flower-pass-{os.getpid()}"


def broker_only_party() -> Celery:
    """A Celery app that knows the broker URL and nothing else of the deployment."""
    party = Celery("outsider", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    party.conf.broker_transport_options = {"global_keyprefix": settings.CELERY_BROKER_KEYPREFIX}
    return party


def ask(party: Celery, method: str) -> dict[str, Any]:
    """The first non-empty answer of every worker to ``inspect <method>`` (workers answer once they are ready)."""

    def answered() -> dict[str, Any] | None:
        return getattr(party.control.inspect(timeout=2), method)() or None

    return harness.wait_for(answered, timeout=60, message=f"no worker answered inspect {method}")


def test_inspect_conf_report_and_stats_reveal_no_setting_to_a_broker_only_party(cluster):
    """inspect conf answers only harmless Celery settings; conf, report and stats carry no secret setting."""
    worker = cluster.worker(
        concurrency=1, pool="solo", env={"SECRET_KEY": SECRET, "FLOWER_BASIC_AUTH": f"admin:{FLOWER_PASSWORD}"}
    )
    harness.wait_ready(worker)
    party = broker_only_party()
    try:
        answers = {method: ask(party, method) for method in ("conf", "report", "stats")}
        answers["conf_with_defaults"] = party.control.inspect(timeout=2).conf(with_defaults=True) or {}
    finally:
        party.close()
    told = json.dumps(answers, default=str)
    for secret in (SECRET, FLOWER_PASSWORD, settings.DATABASES["default"]["NAME"]):
        assert secret not in told
    (conf,) = answers["conf"].values()
    assert (conf["task_acks_late"], conf["task_serializer"]) == (True, "json")
    assert set(conf) <= set(remote_control.CONF_KEYS)
    assert "celery:" in next(iter(answers["report"].values()))["ok"]
    assert "broker" in next(iter(answers["stats"].values()))


def test_flowers_worker_page_still_reads_the_worker_through_remote_control(cluster):
    """Flower's workers API and worker page show the worker's stats, queues and settings, without a secret."""
    worker = cluster.worker(concurrency=1, pool="solo", env={"FLOWER_BASIC_AUTH": f"admin:{FLOWER_PASSWORD}"})
    harness.wait_ready(worker)
    _, base = flower_e2e.start_flower(cluster)
    credentials = (flower_e2e.USER, flower_e2e.PASSWORD)

    def inspected() -> dict[str, Any] | None:
        status, body = flower_e2e.get(f"{base}/api/workers?refresh=1", credentials)
        workers = json.loads(body) if status == 200 else {}
        complete = {n: w for n, w in workers.items() if {"stats", "active_queues", "registered", "conf"} <= set(w)}
        return complete or None

    workers = harness.wait_for(inspected, timeout=60, message="Flower never inspected the worker")
    assert FLOWER_PASSWORD not in json.dumps(workers)
    (name, info), *_ = workers.items()
    status, page = flower_e2e.get(f"{base}/worker/{name}", credentials)
    assert status == 200
    assert FLOWER_PASSWORD.encode() not in page
    assert info["conf"]["task_serializer"] == "json"
    assert "scheduling.run_batch" in info["registered"]
    assert b"task_serializer" in page
