"""Flower with a real worker: it refuses requests without credentials, and shows jobs under their kind's name.

Flower is started the way ``dev.py run`` starts it (its argv from ``dev.child_commands``), with the
credentials in ``FLOWER_BASIC_AUTH``, never on its command line.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
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
    """Without credentials Flower answers 401, with them 200; a due_at batch shows as its kind, not run_batch."""
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
    assert f"[[[{job.id}, '" in tasks[0]["args"]  # the batch's [id, token] pairs
    assert Execution.objects.filter(idempotency_key=f"job:{job.id}").count() == 1
    assert "run_batch" not in {t.get("name") for t in flower_tasks(base).values()}


def test_flower_metrics_need_the_basic_auth_credentials(cluster):
    """Flower's /metrics is 401 without or with wrong credentials, 200 with them; /healthcheck stays open."""
    _, base = start_flower(cluster)
    assert get(f"{base}/metrics")[0] == 401
    assert get(f"{base}/metrics", (USER, "wrong"))[0] == 401
    status, body = get(f"{base}/metrics", (USER, PASSWORD))
    assert status == 200
    assert b"flower_events_total" in body or b"# HELP" in body
    assert get(f"{base}/healthcheck") == (200, b"OK")
