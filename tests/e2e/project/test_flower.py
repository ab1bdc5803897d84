"""Flower with a real worker: it refuses requests without credentials, and shows jobs under their kind's name.

(Each job's state in Flower, RETRY and FAILURE included: ``tests/e2e/due_at/test_task_events.py``.)

Flower is started the way ``dev.py run`` starts it (its argv from ``dev.child_commands``), with the
credentials in ``FLOWER_BASIC_AUTH``, never on its command line.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import dev
from scheduling import api
from tasks.models import Execution
from tests.e2e import harness

pytestmark = pytest.mark.e2e

USER, PASSWORD = "flower-user", f"flower-pass-{os.getpid()}"  # unique: the ps check sees every process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, credentials: tuple[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET; HTTP errors are answers too. Connection errors become status 0."""
    request = urllib.request.Request(url)  # noqa: S310 - a 127.0.0.1 URL this test built
    if credentials:
        token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def flower_tasks(base: str) -> dict[str, Any]:
    status, body = get(f"{base}/api/tasks", (USER, PASSWORD))
    return json.loads(body) if status == 200 else {}


def start_flower(cluster: harness.Cluster) -> tuple[harness.Proc, str]:
    """Flower as dev.py starts it, its credentials in the environment; (process, base URL) once it listens."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = dev.child_commands(web_port=free_port(), flower_port=port)["flower"]
    env = harness.base_env({**cluster.env, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"})
    flower = harness.Proc("flower", argv, env, cluster.log_dir)
    cluster.procs.append(flower)
    harness.wait_for(lambda: get(f"{base}/")[0] != 0, timeout=90, message="Flower did not start listening")
    return flower, base


def test_flower_password_is_not_on_its_command_line(cluster):
    """`ps` (/proc/<pid>/cmdline) shows no Flower password, and Flower still enforces it from FLOWER_BASIC_AUTH."""
    flower, base = start_flower(cluster)
    cmdline = Path(f"/proc/{flower.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "flower" in cmdline
    assert PASSWORD not in cmdline
    assert "basic-auth" not in cmdline
    assert get(f"{base}/")[0] == 401
    assert get(f"{base}/", (USER, PASSWORD))[0] == 200
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert PASSWORD not in ps


def test_flower_refuses_anonymous_requests_and_names_jobs_by_kind(cluster):
    """Without credentials Flower answers 401, with them 200; a job shows as its kind, its batch as batch:<kind>."""
    _, base = start_flower(cluster)

    assert get(f"{base}/")[0] == 401
    assert get(f"{base}/api/tasks")[0] == 401
    assert get(f"{base}/", (USER, "wrong"))[0] == 401
    assert get(f"{base}/", (USER, PASSWORD))[0] == 200

    worker = cluster.worker(concurrency=1, pool="solo")
    harness.wait_for(lambda: "ready" in worker.log(), timeout=90, message="the worker did not start")
    # The worker's control loop claims it and sends a scheduling.run_batch message named by the kind.
    job = api.schedule("demo.record", {"label": "flower"}, delay=0)

    def named_task() -> list[dict[str, Any]]:
        return [
            t for t in flower_tasks(base).values() if t.get("name") == "demo.record" and t.get("state") == "SUCCESS"
        ]

    tasks = harness.wait_for(named_task, timeout=60, message="Flower never showed a demo.record task")
    assert tasks[0]["args"] == f"[{job.id}]"  # the job's id, never its payload
    assert Execution.objects.filter(idempotency_key=f"job:{job.id}").count() == 1
    batches = harness.wait_for(
        lambda: [t for t in flower_tasks(base).values() if f"[[[{job.id}, '" in (t.get("args") or "")],
        timeout=30,
        message="Flower never showed the batch",
    )  # the batch's [id, token] pairs
    # batch:<kind> from the worker's events; Celery's own task-sent event names the real task, and when it
    # reaches Flower last Celery's state keeps that name. Never the kind's: that name is its jobs'.
    assert batches[0]["name"] in {"batch:demo.record", "scheduling.run_batch"}
    # its success rides in the pool process's message with its jobs' events (Celery's own are not sent)
    batch = harness.wait_for(
        lambda: [t for t in flower_tasks(base).values() if t["uuid"] == batches[0]["uuid"] and t.get("succeeded")],
        timeout=30,
        message="Flower never showed the batch succeeded",
    )[0]
    assert (batch["state"], batch["received"], batch["started"]) == ("SUCCESS", batch["started"], batch["started"])
    assert batch["runtime"] is not None


def test_flower_metrics_need_the_basic_auth_credentials(cluster):
    """Flower's /metrics is 401 without or with wrong credentials, 200 with them; /healthcheck stays open."""
    _, base = start_flower(cluster)
    assert get(f"{base}/metrics")[0] == 401
    assert get(f"{base}/metrics", (USER, "wrong"))[0] == 401
    status, body = get(f"{base}/metrics", (USER, PASSWORD))
    assert status == 200
    assert b"flower_events_total" in body or b"# HELP" in body
    assert get(f"{base}/healthcheck") == (200, b"OK")


def post(url: str, body: dict[str, Any], credentials: tuple[str, str]) -> tuple[int, bytes]:
    """(status, body) of a JSON POST with basic auth; HTTP errors are answers too."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")  # noqa: S310
    token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_flower_as_compose_runs_it_holds_no_app_secret_and_cannot_run_a_kind(cluster):
    """Compose's Flower (only the broker URL and its login) serves; its task API runs no kind and no fixed-time tick."""
    import yaml
    from django.conf import settings

    from scheduling import schedules
    from scheduling.models import OutcomeCounter, ScheduledJob, ScheduleRun

    compose = yaml.safe_load((harness.ROOT / "docker-compose.yml").read_text())["services"]["flower"]
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        *[arg for arg in compose["command"] if not arg.startswith(("--port", "--address", "--conf"))],
        f"--conf={harness.ROOT / 'flowerconfig.py'}",
        "--address=127.0.0.1",
        f"--port={port}",
    ]
    assert argv[2:6] == ["celery", "-A", "project.flower_app", "flower"], argv
    env = {  # what compose gives it, and nothing of the application's (no SECRET_KEY, DATABASE_URL, DEBUG)
        "PATH": os.environ["PATH"],
        "HOME": str(cluster.log_dir),
        "PYTHONPATH": str(harness.ROOT),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CELERY_BROKER_KEYPREFIX": settings.CELERY_BROKER_KEYPREFIX,  # this test run's keys on the shared Redis
        "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}",
    }
    flower = harness.Proc("flower-compose", argv, env, cluster.log_dir)
    cluster.procs.append(flower)
    base = f"http://127.0.0.1:{port}"
    harness.wait_for(lambda: get(f"{base}/")[0] != 0 or flower.popen.poll() is not None, 90, message="Flower")
    assert flower.popen.poll() is None, flower.log()
    assert get(f"{base}/")[0] == 401
    assert get(f"{base}/", (USER, PASSWORD))[0] == 200

    worker = cluster.worker(concurrency=1, pool="solo")
    harness.wait_for(lambda: "ready" in worker.log(), timeout=90, message="the worker did not start")
    forged = {"args": ["demo.record", {"label": "via-flower"}, 1, "flower-forged"]}
    assert post(f"{base}/api/task/apply/scheduling.run_deferred", forged, (USER, PASSWORD))[0] == 404
    status, _ = post(f"{base}/api/task/send-task/scheduling.run_deferred", forged, (USER, PASSWORD))
    assert status == 200  # Flower sends it; the worker refuses it
    harness.wait_for(lambda: "deferral message refused" in worker.log(), 60, message="the worker to refuse it")
    real = api.defer("demo.record", {"label": "real"}, 0.2)
    harness.wait_for(
        lambda: Execution.objects.filter(idempotency_key=f"broker:{real.id}").exists(), 60, message="defer() to run"
    )
    assert not Execution.objects.filter(idempotency_key="broker:flower-forged").exists()
    assert not ScheduledJob.objects.filter(key="broker:flower-forged").exists()

    # A declared schedule's run cannot be added either: a made-up tick, and no tick at all.
    schedules.sync(declarations=[schedules.make(name="flower-target", kind="demo.record", every=3600)])
    tick = {"kwargs": {"schedule": "flower-target", "tick": "2030-01-01T00:00:00+00:00", "trigger": "manual"}}
    assert post(f"{base}/api/task/apply/scheduling.run_fixed", tick, (USER, PASSWORD))[0] == 404
    for body in (tick, {"kwargs": {"schedule": "flower-target"}}):
        assert post(f"{base}/api/task/send-task/scheduling.run_fixed", body, (USER, PASSWORD))[0] == 200
    harness.wait_for(
        lambda: worker.log().count("fixed-time run message refused") == 2, 60, message="the worker to refuse both"
    )
    assert not ScheduleRun.objects.filter(schedule__periodic_task__name="flower-target").exists()
    # the worker logs a refusal, then counts it: the second count may land just after its log line
    expected = {"scheduling.run_deferred": 1, "scheduling.run_fixed": 2}
    harness.wait_for(
        lambda: {c.label: c.value for c in OutcomeCounter.objects.filter(metric="refused_messages")} == expected,
        30,
        message="the refusals to be counted",
    )
    refused = {c.label: c.value for c in OutcomeCounter.objects.filter(metric="refused_messages")}
    assert refused == expected
