"""/livez and /readyz, and the worker's liveness watcher behind ``manage.py timekeeper probe``."""

from __future__ import annotations

import io
import json
import os
import socket
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from scheduling import api
from scheduling.core import liveness
from scheduling.due_at import control
from scheduling.due_at import liveness as worker_liveness
from scheduling.models import SchedulerHeartbeat


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def closed_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker URL points at a port nobody listens on."""
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{free_port()}/0")  # Celery's broker_url reads it first


@pytest.fixture
def liveness_dir(tmp_path):  # type: ignore[no-untyped-def]
    with override_settings(SCHEDULING_LIVENESS_DIR=str(tmp_path)):
        yield tmp_path


def probe(role: str, *extra: str) -> str:
    out = io.StringIO()
    call_command("timekeeper", "probe", role, *extra, stdout=out)
    return out.getvalue()


# --- /livez ------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_livez_is_200_with_no_query_while_the_database_and_the_broker_are_gone(client, raw_connect, closed_broker):
    """/livez reads nothing: 200 with this process's database session killed and the broker unreachable."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = raw_connect(autocommit=True)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/livez")
        assert (response.status_code, response.json()) == (200, {"status": "ok"})
        assert len(queries) == 0
        assert client.get("/readyz").status_code == 503, "the same failure makes the pod unready"
    finally:
        connection.close()


# --- /readyz -----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_readyz_is_200_when_database_and_broker_answer_even_with_a_backlog(client):
    """/readyz checks the database and the broker only: a backlog over /healthz's threshold keeps it 200."""
    api.schedule("demo.noop", {}, delay=0)
    with override_settings(SCHEDULING_HEALTH_MAX_BACKLOG=0):
        assert "backlog" in client.get("/healthz").json()["failing"]
        response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert (body["status"], body["failing"]) == ("ok", [])
    assert {name: part["status"] for name, part in body["checks"].items()} == {"database": "ok", "broker": "ok"}
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.django_db
def test_readyz_names_an_unreachable_broker(client, closed_broker):
    """A broker URL pointing at a closed port: /readyz is 503 naming broker."""
    response = client.get("/readyz")
    assert (response.status_code, response.json()["failing"]) == (503, ["broker"])


@pytest.mark.django_db(transaction=True)
def test_readyz_names_a_lost_database(client, raw_connect):
    """With this process's PostgreSQL session killed, /readyz is 503 naming database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = raw_connect(autocommit=True)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        response = client.get("/readyz")
        assert (response.status_code, response.json()["failing"]) == (503, ["database"])
    finally:
        connection.close()


@pytest.mark.django_db
def test_readyz_details_need_the_metrics_token(client, closed_broker):
    """Anonymous callers see each part's status only; the token shows the error."""
    with override_settings(SCHEDULING_METRICS_TOKEN="probe-secret"):
        anonymous = client.get("/readyz").json()["checks"]["broker"]
        detailed = client.get("/readyz", HTTP_AUTHORIZATION="Bearer probe-secret").json()["checks"]["broker"]
    assert anonymous == {"status": "failing"}
    assert "Error" in detailed["error"]


# --- the worker's liveness watcher and `timekeeper probe` --------------------------------------------


def test_probe_fails_when_no_loop_ever_wrote_and_when_the_file_is_stale(liveness_dir):
    """No file: exit 1 saying so; a file older than --max-age: exit 1; a fresh one: exit 0."""
    with pytest.raises(CommandError, match="does not exist"):
        probe("beat")
    liveness.write("beat", leading=True)
    assert probe("beat").startswith("alive:")
    body = json.loads(liveness.path("beat").read_text())
    body["alive_at"] -= 120
    liveness.path("beat").write_text(json.dumps(body))
    with pytest.raises(CommandError, match=r"last turned 1[12][0-9]s ago"):
        probe("beat", "--max-age", "60")


def test_probe_rejects_an_unknown_role():
    """`timekeeper probe bogus` is a usage error naming the choices."""
    with pytest.raises(CommandError, match="invalid choice"):
        probe("bogus")


@pytest.mark.django_db(transaction=True)
def test_worker_watcher_writes_while_the_leading_control_loop_turns_and_records_its_heartbeat(liveness_dir):
    """A real control loop leading: the watcher writes the file, the probe passes, the control heartbeat row is set."""
    loop = control.ControlLoop()
    loop.start()
    try:
        watcher = worker_liveness.Watcher(loop=lambda: loop)
        assert watcher.observe() is True
        for _ in range(200):
            if loop.leadership.leading and loop.counters.turns > 0:
                break
            loop.stopping.wait(0.05)
        assert loop.leadership.leading
        assert watcher.observe() is True
        assert json.loads(liveness.path("worker").read_text())["leading"] is True
        assert probe("worker").startswith("alive:")
        assert SchedulerHeartbeat.objects.filter(role="control").exists()
    finally:
        loop.stop()
        connection.close()


@pytest.mark.django_db
def test_worker_watcher_stops_writing_for_a_stalled_leader_or_a_dead_loop_thread(liveness_dir):
    """A leader whose turns do not advance, or a loop thread that died: the file is not refreshed."""
    loop = control.ControlLoop()
    stuck = threading.Event()
    loop.thread = threading.Thread(target=stuck.wait, daemon=True)  # alive, like a turn blocked in a query
    loop.thread.start()
    loop.leadership._leading = True  # the state a leader stuck in its turn is in
    watcher = worker_liveness.Watcher(loop=lambda: loop)
    try:
        assert watcher.observe() is True, "the first look after taking the lead counts as progress"
        os.unlink(liveness.path("worker"))
        assert watcher.observe() is False, "no turn since the last look"
        assert not liveness.path("worker").exists()
        loop.counters.turns += 1
        assert watcher.observe() is True
    finally:
        loop.leadership._leading = False
        stuck.set()
        loop.thread.join(5)
    assert watcher.observe() is False, "the loop thread is gone"


@pytest.mark.django_db
def test_worker_watcher_stops_writing_for_a_leader_whose_duties_thread_is_stuck_or_gone(liveness_dir):
    """A leader whose turns advance but whose duties thread (the planner, the orphan pass) begins no round, or
    a loop whose duties thread has ended (leading or not): the file is not refreshed, so the probe restarts it."""
    loop = control.ControlLoop()
    turning, stuck = threading.Event(), threading.Event()
    loop.thread = threading.Thread(target=turning.wait, daemon=True)
    loop.duties_thread = threading.Thread(target=stuck.wait, daemon=True)  # alive, like a pass blocked in a query
    loop.thread.start()
    loop.duties_thread.start()
    loop.leadership._leading = True
    watcher = worker_liveness.Watcher(loop=lambda: loop)
    try:
        assert watcher.observe() is True, "the first look after taking the lead counts as progress"
        loop.counters.turns += 1
        assert watcher.observe() is False, "turns advanced, duty passes did not"
        loop.counters.turns += 1
        loop.counters.duty_rounds += 1
        assert watcher.observe() is True
        stuck.set()
        loop.duties_thread.join(5)
        loop.counters.turns += 1
        loop.counters.duty_rounds += 1
        assert watcher.observe() is False, "the duties thread is gone"
        loop.leadership._leading = False
        assert watcher.observe() is False, "a standby without it would lead with no duties"
    finally:
        loop.leadership._leading = False
        stuck.set()
        turning.set()
        loop.thread.join(5)


def test_worker_without_a_control_loop_is_alive_while_its_watcher_runs(liveness_dir):
    """SCHEDULING_CONTROL_IN_WORKERS off: no loop, the watcher's own turn is the sign of life."""
    assert worker_liveness.Watcher(loop=lambda: None).observe() is True
    assert json.loads(liveness.path("worker").read_text())["control_loop"] is False
