"""Security end to end with real processes: a worker that accepts pickle refuses to start, a pickled message
in the queue is refused and never runs, Flower asks for credentials, no payload reaches any log."""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import secrets
import urllib.error
import urllib.request
import uuid
from base64 import b64encode
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from scheduling import api
from scheduling.models import JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e import harness
from tests.e2e.private_services import free_port
from tests.support import ROOT

# --- Only JSON ---------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_worker_refuses_to_start_when_pickle_is_accepted(tmp_path: Path, cluster) -> None:
    """A celery worker under settings that accept pickle exits at start naming scheduling.E002, consuming nothing."""
    (tmp_path / "pickle_worker_settings.py").write_text(
        "from project.settings import *  # noqa\nCELERY_ACCEPT_CONTENT = ['json', 'pickle']\n"
    )
    pythonpath = os.pathsep.join([str(tmp_path), str(ROOT)])
    env = {
        "DJANGO_SETTINGS_MODULE": "pickle_worker_settings",
        "PYTHONPATH": pythonpath,
        "C_FORCE_ROOT": "1",  # as root Celery refuses pickle by itself; this test is about Timekeeper's refusal
    }
    worker = cluster.worker(env=env)
    assert worker.popen.wait(60) != 0
    assert "scheduling.E002" in worker.log()
    assert "ready." not in worker.log()


# --- The broker: a pickle message is refused ----------------------------------------------------------


class _Touch:
    """Unpickling this creates a file: the side effect a pickle payload could have."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def pickle_message(task: str, args: list[Any], queue: str) -> bytes:
    """A Celery protocol-2 message as kombu's Redis transport stores it, with a pickled body."""
    task_id = str(uuid.uuid4())
    body = pickle.dumps((args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}))
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "binary",
        "content-type": "application/x-python-serialize",
        "headers": {
            "lang": "py",
            "task": task,
            "id": task_id,
            "root_id": task_id,
            "parent_id": None,
            "group": None,
            "retries": 0,
            "eta": None,
            "expires": None,
            "argsrepr": "()",
            "kwargsrepr": "{}",
            "origin": "test_bad_input",
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(envelope).encode()


@pytest.mark.e2e
def test_pickle_message_in_the_queue_is_refused_and_never_runs(cluster, broker, tmp_path: Path) -> None:
    """A pickled message LPUSHed onto the worker's queue is refused by content type; its payload never runs."""
    worker = cluster.worker()
    cluster.beat()  # claims the JSON job queued behind the pickles
    harness.wait_ready(worker)
    evidence = tmp_path / "unpickled"
    prefix = getattr(settings, "CELERY_BROKER_KEYPREFIX", "")
    for queue in ["celery", "timekeeper.deferred"]:
        task = "scheduling.run_deferred" if queue == "timekeeper.deferred" else "scheduling.sweep"
        broker.lpush(f"{prefix}{queue}", pickle_message(task, [_Touch(evidence)], queue))
    # A JSON job queued behind them runs: the worker consumed past the pickles and is healthy.
    job = api.schedule("demo.record", {"label": "after the pickles"}, delay=0)

    harness.wait_for(lambda: Execution.objects.filter(idempotency_key=f"job:{job.id}").exists(), 60, message="the job")
    harness.wait_for(
        lambda: worker.log().count("Refusing to deserialize untrusted content of type pickle") >= 2,
        30,
        message="the worker to refuse both pickles",
    )
    assert not evidence.exists(), "the pickled payload was unpickled"
    assert worker.popen.poll() is None
    for queue in ["celery", "timekeeper.deferred"]:
        assert broker.llen(f"{prefix}{queue}") == 0, f"the pickle is not left waiting on {queue}"
    # the JSON job's own message leaves the unacked set when its batch is acknowledged, a moment after
    # its handler's write is visible; a refused pickle held for redelivery would stay there for good
    harness.wait_for(lambda: not broker.hlen(f"{prefix}unacked"), 10, message="no message held for redelivery")
    assert not Execution.objects.exclude(idempotency_key=f"job:{job.id}").exists()


# --- Nobody anonymous ----------------------------------------------------------------------------


def _get(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)  # noqa: S310 - always http://127.0.0.1 (our Flower)
    if auth is not None:
        request.add_header("Authorization", "Basic " + b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our own local URL
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.mark.e2e
def test_flower_requires_basic_auth(tmp_path: Path) -> None:
    """Flower with FLOWER_BASIC_AUTH answers 401 to anonymous and wrong credentials, 200 to the right ones."""
    port = free_port()
    user, password = "ops", secrets.token_urlsafe(16)
    proc = harness.Proc(
        "flower",
        [*harness.CELERY, "flower", f"--port={port}", "--address=127.0.0.1"],
        harness.base_env({"CELERY_BROKER_URL": settings.CELERY_BROKER_URL, "FLOWER_BASIC_AUTH": f"{user}:{password}"}),
        tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        harness.wait_for(lambda: proc.popen.poll() is not None or _port_open(port), 60, message="Flower to listen")
        assert proc.popen.poll() is None, proc.log()
        for path in ["/", "/workers", "/tasks", "/api/workers", "/api/tasks", "/broker"]:
            assert _get(base + path) == 401, path
            assert _get(base + path, f"{user}:wrong") == 401, path
        assert _get(f"{base}/", f"{user}:{password}") == 200
    finally:
        proc.stop()


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --- No payloads in logs ------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:No directory at:UserWarning")  # whitenoise: collectstatic has not run here
def test_payload_contents_never_reach_the_logs(cluster, caplog) -> None:
    """Jobs and deferrals carrying a secret marker run (and fail) through a real worker; no log shows it."""
    caplog.set_level(logging.DEBUG)
    marker = f"SECRET-{secrets.token_hex(8)}"
    worker = cluster.worker()
    beat = cluster.beat()
    harness.wait_ready(worker)
    ok = api.schedule("demo.record", {"label": marker, "note": marker}, delay=1)
    failing = api.schedule("demo.fail", {"card": marker}, delay=1, max_attempts=2)
    deferred = api.defer("demo.record", {"label": marker}, 1)
    deferred_failing = api.defer("demo.fail", {"card": marker}, 1)
    # Through the HTTP API too: a payload its schema refuses (the 400 answers the caller) and one it takes.
    user = get_user_model().objects.create_user("logs-check")
    web = Client()
    web.force_login(user)
    refused = web.post(
        "/api/jobs/",
        json.dumps({"kind": "reminders.trial_ending", "payload": {"user_id": marker, "trial_id": 1}, "delay": 1}),
        content_type="application/json",
    )
    assert refused.status_code == 400
    created = web.post(
        "/api/jobs/",
        json.dumps({"kind": "demo.record", "payload": {"label": marker}, "delay": 1}),
        content_type="application/json",
    )
    assert created.status_code == 201

    harness.wait_for(lambda: ScheduledJob.objects.get(pk=ok.id).state == JobState.DONE, 60, message="the job")
    harness.wait_for(lambda: ScheduledJob.objects.get(pk=failing.id).state == JobState.DEAD, 60, message="the failure")
    harness.wait_for(
        lambda: ScheduledJob.objects.filter(key=f"broker:{deferred_failing.id}", state=JobState.DEAD).exists(),
        90,
        message="the failing deferral to be recorded dead",
    )
    from tasks.models import Execution

    assert Execution.objects.filter(idempotency_key=f"broker:{deferred.id}").count() == 1
    # The marker did travel (it is stored and was handed to the handlers) ...
    assert ScheduledJob.objects.get(pk=ok.id).payload["label"] == marker
    # ... but no log line anywhere shows it.
    logs = {"worker": worker.log(), "beat": beat.log(), "test process": caplog.text}
    assert "deferral" in logs["test process"] or "scheduled" in logs["test process"]
    assert "deferral dead" in logs["worker"], "the worker log covers the failing deferral"
    for where, text in logs.items():
        assert marker not in text, f"the payload marker appears in the {where} log"
