"""project.services: decide() (configured beats reachable beats embedded) and the run state dev.py manage reads."""
from __future__ import annotations

import os
import socket

import pytest

from project import services


class FakeProbe:
    """Answers for the listed ports only, and remembers what it was asked."""

    def __init__(self, *open_ports: int) -> None:
        self.open_ports = set(open_ports)
        self.asked: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> bool:
        self.asked.append((host, port))
        return port in self.open_ports


CONFIGURED_ENV = {
    "DATABASE_URL": "postgresql://app:secret@db.internal:5432/app",
    "CELERY_BROKER_URL": "redis://:secret@cache.internal:6379/2",
}


def test_configured_beats_reachable() -> None:
    """Configured URLs are used as they are, and nothing is probed."""
    probe = FakeProbe(5432, 6379)
    plan = services.decide(CONFIGURED_ENV, probe)
    assert plan.database == services.Choice("PostgreSQL", services.CONFIGURED, CONFIGURED_ENV["DATABASE_URL"])
    assert plan.broker == services.Choice("Redis", services.CONFIGURED, CONFIGURED_ENV["CELERY_BROKER_URL"])
    assert probe.asked == []


def test_reachable_beats_embedded() -> None:
    """With nothing configured, the machine's default ports are used when they answer."""
    plan = services.decide({}, FakeProbe(5432, 6379))
    assert plan.database == services.Choice(
        "PostgreSQL", services.REACHABLE, "postgresql://postgres@127.0.0.1:5432/timekeeper"
    )
    assert plan.broker == services.Choice("Redis", services.REACHABLE, "redis://127.0.0.1:6379/0")


def test_embedded_when_nothing_answers() -> None:
    """With nothing configured and nothing answering, both services are embedded (URL not known yet)."""
    plan = services.decide({}, FakeProbe())
    assert plan.database == services.Choice("PostgreSQL", services.EMBEDDED, None)
    assert plan.broker == services.Choice("Redis", services.EMBEDDED, None)


def test_each_service_decided_on_its_own() -> None:
    """A configured database and an absent Redis give configured PostgreSQL and embedded Redis."""
    plan = services.decide({"DATABASE_URL": CONFIGURED_ENV["DATABASE_URL"]}, FakeProbe(5432))
    assert plan.database.source == services.CONFIGURED
    assert plan.broker.source == services.EMBEDDED


def test_empty_variable_counts_as_unset() -> None:
    """An empty DATABASE_URL does not count as configured."""
    plan = services.decide({"DATABASE_URL": ""}, FakeProbe(5432))
    assert plan.database.source == services.REACHABLE


def test_tests_use_their_own_redis_database() -> None:
    """For the test command the reachable Redis URL points at database 15."""
    plan = services.decide({}, FakeProbe(6379), purpose="test")
    assert plan.broker.url == "redis://127.0.0.1:6379/15"


def test_probe_ports_can_be_moved() -> None:
    """TIMEKEEPER_PG_PROBE_PORT / TIMEKEEPER_REDIS_PROBE_PORT choose which ports are probed."""
    probe = FakeProbe(5432, 6379)
    environ = {"TIMEKEEPER_PG_PROBE_PORT": "1", "TIMEKEEPER_REDIS_PROBE_PORT": "2"}
    plan = services.decide(environ, probe)
    assert probe.asked == [("127.0.0.1", 1), ("127.0.0.1", 2)]
    assert plan.database.source == plan.broker.source == services.EMBEDDED


def test_moved_probe_port_is_used_when_it_answers() -> None:
    """A moved probe port that answers ends up in the URL."""
    plan = services.decide({"TIMEKEEPER_PG_PROBE_PORT": "5433"}, FakeProbe(5433))
    assert plan.database.url == "postgresql://postgres@127.0.0.1:5433/timekeeper"


@pytest.mark.parametrize("raw", ["abc", "0", "70000"])
def test_bad_probe_port_is_refused(raw: str) -> None:
    """A probe port that is not a TCP port number is an error naming the variable."""
    with pytest.raises(ValueError, match="TIMEKEEPER_PG_PROBE_PORT"):
        services.decide({"TIMEKEEPER_PG_PROBE_PORT": raw}, FakeProbe())


def test_unknown_purpose_is_refused() -> None:
    """Only the run and test commands have a plan."""
    with pytest.raises(ValueError, match="purpose"):
        services.decide({}, FakeProbe(), purpose="deploy")


def test_describe_hides_the_password() -> None:
    """A configured URL is printed with its password masked (project.redaction)."""
    choice = services.Choice("Redis", services.CONFIGURED, "redis://:secret@cache:6379/2")
    assert services.describe(choice, "redis://:secret@cache:6379/2") == "using configured Redis at redis://:***@cache:6379/2"


def test_describe_says_where_a_service_comes_from() -> None:
    """The printed line names the source and the redacted URL."""
    choice = services.Choice("PostgreSQL", services.EMBEDDED, None)
    line = services.describe(choice, "postgresql://postgres:@/timekeeper?host=/x")
    assert line == "using embedded PostgreSQL at postgresql://postgres:@/timekeeper?host=/x"


def test_tcp_probe_closed_port() -> None:
    """The real probe says no for a port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        assert services.tcp_probe("127.0.0.1", port) is False


def test_tcp_probe_open_port() -> None:
    """The real probe says yes for a listening port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert services.tcp_probe("127.0.0.1", sock.getsockname()[1]) is True


def test_the_run_state_round_trips_with_mode_0600(tmp_path) -> None:
    """write_state keeps the pid and the three variables (and nothing else) in a file only its owner reads."""
    path = tmp_path / "var" / "services.env"
    environ = {**CONFIGURED_ENV, "CELERY_BROKER_KEYPREFIX": "tk:", "SECRET_KEY": "not-this"}
    services.write_state(path, 4242, environ)
    assert path.stat().st_mode & 0o777 == 0o600
    assert "not-this" not in path.read_text()
    state = services.parse_state(path.read_text())
    assert state == services.RunState(4242, {**CONFIGURED_ENV, "CELERY_BROKER_KEYPREFIX": "tk:"})


@pytest.mark.parametrize(
    "text",
    ["", "TIMEKEEPER_RUN_PID=x\nDATABASE_URL=a\nCELERY_BROKER_URL=b", "TIMEKEEPER_RUN_PID=1\nDATABASE_URL=a"],
)
def test_a_state_without_a_pid_or_both_urls_is_none(text: str) -> None:
    """A file without a numeric pid, or without the database and the broker URL, is not a run's state."""
    assert services.parse_state(text) is None


def test_a_state_left_by_a_stopped_run_or_another_program_is_not_running(tmp_path) -> None:
    """No file, a file whose pid is gone, or a pid that is not dev.py: each is (None, the reason)."""
    path = tmp_path / "services.env"
    assert services.running_state(path) == (None, "no services.env: no `python3 dev.py run` is running")
    services.write_state(path, os.getpid(), CONFIGURED_ENV)  # this pytest: alive, but not dev.py
    state, why = services.running_state(path)
    assert state is None
    assert why.endswith(f"was left by a `dev.py run` that stopped (pid {os.getpid()})")
