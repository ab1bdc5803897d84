"""Schemathesis against a real server: no input the OpenAPI document allows, or forbids, gets a 5xx."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduling.web import auth
from tests.e2e import harness

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:No directory at:UserWarning")]

MAX_EXAMPLES = 20  # per operation and phase: ~500 requests, about 30 s on 2 cores (1,471 at 150 found no 5xx either)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own server on 127.0.0.1
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def server(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    """``manage.py runserver`` on a free port against the test database; yields its base URL."""
    port = free_port()
    argv = [sys.executable, "manage.py", "runserver", "--noreload", "--nothreading", f"127.0.0.1:{port}"]
    proc = harness.Proc("runserver", argv, harness.base_env(), harness.ARTIFACTS / "api-fuzz")
    base = f"http://127.0.0.1:{port}"
    try:
        harness.wait_for(
            lambda: answers(f"{base}/api/jobs/openapi.json") or proc.popen.poll() is not None, 60, message="runserver"
        )
        assert proc.popen.poll() is None, proc.log()[-4000:]
        yield base
    finally:
        proc.stop()


def test_fuzzed_requests_never_get_a_server_error(server: str, django_user_model: Any, tmp_path: Path):
    """Examples, coverage (negative data), fuzzing and stateful (links) phases: zero 5xx responses."""
    # The seed is random on purpose (more of the input space over many runs); a failure prints it,
    # and `st run ... --seed <it>` replays the run.
    user = django_user_model.objects.create_user("fuzzer", password="pw-fuzz")
    _, token = auth.issue_token(user, "schemathesis")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{server}/api/jobs/openapi.json",
            "--url",
            server,
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "not_a_server_error",
            "--mode",
            "all",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # schemathesis keeps a .schemathesis/ folder in its working directory
        env=harness.base_env(),
        check=False,
    )
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-4000:]
