"""`python3 dev.py run` end to end: nothing secret on the screen or in any process's command line, a quiet start,
and `python3 dev.py manage` from a second terminal reaching the same servers."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import redis
from django.conf import settings
from psycopg2 import sql

from tests.e2e import harness
from tests.support import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN_ID = os.getpid()
SECRET = f"s3cret-devrun-{RUN_ID}"  # unique: the ps check sees every process on the machine
SERVICES = ROOT / "var" / "services.env"  # what the run chose, for `dev.py manage`


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status_of(url: str, credentials: str | None = None) -> int:
    """The HTTP status of a GET (0 when nothing answers)."""
    request = urllib.request.Request(url)  # noqa: S310 - a 127.0.0.1 URL this test built
    if credentials:
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def session_members(session: int) -> dict[int, str]:
    """pid -> command line of every live process in ``session`` (dev.py and everything it started)."""
    members = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] not in {"Z", "X"}:
                cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                members[int(stat.parent.name)] = cmdline
    return members


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh database on the test server for this run of dev.py; dropped afterwards."""
    entry = settings.DATABASES["default"]
    name = f"tk_devrun_{RUN_ID}"
    admin = psycopg2.connect(dbname="postgres", user=entry["USER"], host=entry["HOST"], port=entry["PORT"] or None)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    # Trust authentication accepts any password: the URL carries one, as a real deployment's does.
    yield f"postgresql://{entry['USER']}:{SECRET}@{entry['HOST']}:{entry['PORT'] or 5432}/{name}"
    with admin.cursor() as cursor:
        cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()


def start(environ: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python3 dev.py run`` in its own session, logging to ``log_path``, once it says it is up."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["python3", "dev.py", "run"], cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        harness.wait_for(
            lambda: "Ctrl-C stops everything" in log_path.read_text() or process.poll() is not None,
            timeout=240, message="dev.py run did not come up",
        )  # fmt: skip
    except AssertionError:
        stop(process)
        raise
    assert process.poll() is None, log_path.read_text()
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def demo_jobs(database_url: str) -> list[tuple[int, str]]:
    """(id, key) of the demo's keyed jobs in the dev.py run database."""
    with contextlib.closing(psycopg2.connect(database_url)) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT id, key FROM scheduling_scheduledjob WHERE key IS NOT NULL ORDER BY id")
        return [(int(row[0]), str(row[1])) for row in cursor.fetchall()]


def test_run_shows_no_secret_on_screen_or_in_ps_and_seeds_the_demo_once(database: str, tmp_path: Path) -> None:
    """No password printed or in any argv; a second start of ``dev.py run`` adds no demo job."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    host, port, db = (broker.connection_pool.connection_kwargs[key] for key in ("host", "port", "db"))
    prefix = f"tk-devrun-{RUN_ID}:"
    web_port, flower_port = free_port(), free_port()
    dropped = {"DJANGO_SETTINGS_MODULE", "FLOWER_BASIC_AUTH", "SECRET_KEY", "TIMEKEEPER_VERBOSE"}
    environ = {key: value for key, value in os.environ.items() if key not in dropped}
    environ.update(
        DEBUG="1",
        DATABASE_URL=database,
        CELERY_BROKER_URL=f"redis://:{SECRET}@{host}:{port}/{db}",
        CELERY_BROKER_KEYPREFIX=prefix,
        WEB_PORT=str(web_port),
        FLOWER_PORT=str(flower_port),
    )
    log_path, again = tmp_path / "dev-run.log", tmp_path / "dev-run-again.log"
    try:
        process = start(environ, log_path)
        try:
            harness.wait_for(lambda: status_of(f"http://127.0.0.1:{flower_port}/") != 0, timeout=90, message="Flower")
            dev_password = (ROOT / "var" / "dev-password").read_text().strip()

            members = session_members(process.pid)
            commands = " | ".join(members.values())
            for role in ("manage.py runserver", "celery -A project worker", "celery -A project beat", "flower"):
                assert role in commands, role
            for pid, cmdline in members.items():
                assert SECRET not in cmdline, pid
                assert dev_password not in cmdline, pid
            assert status_of(f"http://127.0.0.1:{flower_port}/") == 401
            assert status_of(f"http://127.0.0.1:{flower_port}/", f"admin:{dev_password}") == 200

            # A second terminal, nothing configured: `dev.py manage` reaches this run's servers.
            assert SERVICES.stat().st_mode & 0o777 == 0o600
            second = {k: v for k, v in environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
            second.pop("CELERY_BROKER_KEYPREFIX")
            managed = subprocess.run(
                ["python3", "dev.py", "manage", "timekeeper", "status"], cwd=ROOT, env=second, capture_output=True,
                text=True, timeout=120,
            )  # fmt: skip
            assert managed.returncode == 0, managed.stderr
            assert managed.stdout.splitlines()[0].startswith(f"database 'tk_devrun_{RUN_ID}' on ")
            assert f"using the servers of `python3 dev.py run` (pid {process.pid}" in managed.stderr
            assert SECRET not in managed.stdout + managed.stderr
        finally:
            stop(process)
        assert not SERVICES.exists(), "the run removes its services file when it stops"
        output = log_path.read_text()
        assert "4 demo job(s) added" in output, "the first start seeds the demo"
        # A quiet start: migrations summed up, no warning that needs no action, the URLs once the admin answers.
        assert "Applying " not in output
        assert "==> applied " in output
        assert "Inspect method" not in output
        assert "consumes the deferral queue" not in output
        # the URLs once the admin answers: its line says nothing is "not answering yet". (The order of
        # runserver's access line and dev.py's own line is not asserted: they reach the screen through two
        # pipes, and under load the child's line may come second.)
        (admin_line,) = [line for line in output.splitlines() if line.startswith("==> admin ")]
        assert "not answering yet" not in admin_line
        assert '"GET /admin/login/ HTTP/1.1" 200' in output
        seeded = demo_jobs(database)
        second_run = start(environ, again)  # a second start finds the demo loaded (some of it run meanwhile)
        try:
            # stopped once beat runs its schedule: a beat stopped before its scheduler exists builds it on
            # the way out (Celery's sync at shutdown) and logs a traceback (seen under load; not this test's point)
            harness.wait_for(lambda: "this beat leads now" in again.read_text(), timeout=120, message="beat leads")
        finally:
            stop(second_run)
    finally:
        keys = list(broker.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            broker.delete(*keys)
        broker.close()

    assert "0 demo job(s) added, 4 already loaded" in again.read_text()
    assert "==> database schema up to date" in again.read_text()
    assert demo_jobs(database) == seeded, "no demo job added by the second start"
    for output in (log_path.read_text(), again.read_text()):
        assert SECRET not in output
        assert dev_password not in output
        assert "redis://:***@" in output  # the URLs are shown, masked
        assert "Traceback" not in output


def as_in_a_terminal() -> None:
    """SIGINT back to its default, as for a command a terminal runs: a test run started in the background
    (``.ci/run &`` from a script) inherits SIGINT ignored, and Python then never turns Ctrl-C into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_everything_even_when_the_output_pipe_has_closed(database: str) -> None:
    """``dev.py run | tee log`` then Ctrl-C: tee dies first; dev.py must still stop every process it started."""
    environ = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "TIMEKEEPER_VERBOSE"}}
    environ.update(
        DEBUG="1",
        DATABASE_URL=database,
        CELERY_BROKER_KEYPREFIX=f"tk-devrun-pipe-{RUN_ID}:",
        WEB_PORT=str(free_port()),
        FLOWER_PORT=str(free_port()),
    )
    process = subprocess.Popen(
        ["python3", "dev.py", "run"], cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=as_in_a_terminal,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        seen = []
        for raw in process.stdout:  # until it is up (bounded by the test's own timeout)
            seen.append(raw.decode(errors="replace"))
            if "Ctrl-C stops everything" in seen[-1]:
                break
        assert "Ctrl-C stops everything" in seen[-1], "".join(seen[-30:])
        started = set(session_members(process.pid))
        assert len(started) > 4, "dev.py, web, worker (and its pool), beat, Flower"
        process.stdout.close()  # the reader (tee, a pager) is gone
        os.killpg(process.pid, signal.SIGINT)  # what the terminal sends to its foreground group on Ctrl-C
        process.wait(60)
        harness.wait_for(lambda: not set(session_members(process.pid)) & started, timeout=30, message="orphans")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        for pid in session_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
