"""Schemathesis against a real server: no input the OpenAPI document allows, or forbids, gets a 5xx."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from django.contrib.auth.models import Permission

from scheduling.models import KindControl, Recurrence
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
    # The create rate limit would answer most fuzzed creates 429 before their bodies are read; the
    # 429 itself is tested in test_jobs_api_limits.py and test_jobs_api_openapi.py.
    env = {**harness.base_env(), "SCHEDULING_API_CREATE_BURST": "100000"}
    proc = harness.Proc("runserver", argv, env, harness.ARTIFACTS / "api-fuzz")
    base = f"http://127.0.0.1:{port}"
    try:
        harness.wait_for(
            lambda: answers(f"{base}/api/jobs/openapi.json") or proc.popen.poll() is not None, 60, message="runserver"
        )
        assert proc.popen.poll() is None, proc.log()[-4000:]
        yield base
    finally:
        proc.stop()


def run_schemathesis(server: str, token: str, report_dir: Path, *selection: str) -> subprocess.CompletedProcess[str]:
    """One schemathesis run against ``server``'s document with ``token``: every phase, only the 5xx check."""
    report_dir.mkdir(exist_ok=True)
    return subprocess.run(
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
            *selection,
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
            str(report_dir),
        ],
        capture_output=True,
        text=True,
        cwd=report_dir,  # schemathesis keeps a .schemathesis/ folder in its working directory
        env=harness.base_env(),
        check=False,
    )


def operations_in_report(report_dir: Path) -> set[str]:
    """The operations ("POST /api/recurrences/") schemathesis's JUnit report lists as tested."""
    names = set()
    for report in report_dir.glob("junit-*.xml"):
        tree = ElementTree.parse(report)  # noqa: S314 - the report our own schemathesis run just wrote
        names |= {case.get("name", "") for case in tree.iter("testcase")}
    return names


def test_fuzzed_requests_never_get_a_server_error(server: str, django_user_model: Any, tmp_path: Path):
    """Examples, coverage (negative data), fuzzing and stateful (links) phases: zero 5xx responses.

    Twice: every operation (jobs, recurrences, kinds) with an ordinary user's token, then the kinds
    API (``/api/kinds/``) with an operator's (staff with ``scheduling.change_kindcontrol``), so its
    bodies are judged past the permission check instead of all being 403.
    """
    # The seed is random on purpose (more of the input space over many runs); a failure prints it,
    # and `st run ... --seed <it>` replays the run.
    user = django_user_model.objects.create_user("fuzzer", password="pw-fuzz")
    _, token = auth.issue_token(user, "schemathesis")
    result = run_schemathesis(server, token, tmp_path / "jobs")
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-4000:]
    fuzzed = operations_in_report(tmp_path / "jobs")
    for operation in ("POST /api/recurrences/", "PATCH /api/recurrences/{recurrence_id}", "GET /api/kinds/"):
        assert operation in fuzzed, f"{operation} was not fuzzed: {sorted(fuzzed)}"
    assert Recurrence.objects.filter(owner=user).exists(), "fuzzed creates got past validation and made recurrences"
    operator = django_user_model.objects.create_user("fuzz-operator", password="pw-fuzz", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="change_kindcontrol"))
    _, operator_token = auth.issue_token(operator, "schemathesis-kinds")
    result = run_schemathesis(server, operator_token, tmp_path / "kinds", "--include-path-regex", "^/api/kinds/")
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-4000:]
    assert KindControl.objects.exists(), "the operator's requests got past the permission check and changed a kind"
