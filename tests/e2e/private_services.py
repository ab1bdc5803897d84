"""Private PostgreSQL and Redis servers for tests that stop, restart or break them.

The machine's shared servers are never touched: each test gets its own PostgreSQL (the machine's
binaries, or pgserver's, on a temporary data directory and a free port) and its own
``redis-server`` (no persistence, or append-only: ``REDIS_APPENDONLY = True`` in the test module) on a
free port, and the worker and beat processes it starts are
pointed at them through ``DATABASE_URL`` / ``CELERY_BROKER_URL``.

The slow part, ``initdb`` plus ``manage.py migrate``, happens once per session into a template
data directory (``pg_template``); each test copies it and starts the copy (well under a second).
As root, PostgreSQL runs as the ``postgres`` user (``runuser``), which owns the data directories.

Usage in a test module::

    from tests.e2e import private_services

    pg_template = private_services.pg_template  # the fixtures, made visible to this module's tests
    private_stack = private_services.private_stack

    def test_x(private_stack):
        stack = private_stack
        worker = stack.cluster.worker()
        stack.pg.restart(mode="immediate")
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import redis
from django.conf import settings

from scheduling.due_at import store
from tests import support
from tests.e2e import harness

DATABASE = "timekeeper"
START_TIMEOUT_SECONDS = 60
ARTIFACT_FILE = harness.ARTIFACTS / "faults-servers.json"


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bindir() -> Path:
    """Where initdb and pg_ctl are: $TIMEKEEPER_PG_BIN, the machine's newest, PATH, then pgserver's."""
    configured = os.environ.get("TIMEKEEPER_PG_BIN")
    if configured:
        return Path(configured)
    machine = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    if machine:
        return Path(machine[-1])
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    import pgserver  # the venv always has it (the embedded fallback of dev.py)

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def _run_as() -> tuple[list[str], int | None, int | None]:
    """(argv prefix, uid, gid) to run PostgreSQL as: postgres (or nobody) when we are root."""
    if os.geteuid() != 0:
        return [], None, None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return ["runuser", "-u", name, "--"], entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root and there is no postgres or nobody user to run PostgreSQL as")


def _chown_tree(path: Path, uid: int | None, gid: int | None) -> None:
    if uid is None or gid is None:
        return
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


class PrivatePostgres:
    """A PostgreSQL server of our own on ``127.0.0.1:port``, data in ``base/data``."""

    def __init__(self, base: Path, port: int | None = None) -> None:
        self.base = base
        self.data = base / "data"
        self.port = port or free_port()
        self.log_path = base / "postgres.log"
        self.bindir = _pg_bindir()
        self.prefix, self.uid, self.gid = _run_as()

    def _pg(self, *argv: str, timeout: float = START_TIMEOUT_SECONDS) -> subprocess.CompletedProcess[str]:
        cmd = [*self.prefix, str(self.bindir / argv[0]), *argv[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.base)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def initdb(self) -> None:
        """Create the cluster (trust auth for local TCP, user postgres)."""
        self.base.mkdir(parents=True, exist_ok=True)
        _chown_tree(self.base, self.uid, self.gid)
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")

    def copy_from(self, template: Path) -> None:
        """Make this server's data directory a copy of a stopped template's."""
        self.base.mkdir(parents=True, exist_ok=True)
        shutil.copytree(template, self.data, symlinks=True)
        _chown_tree(self.base, self.uid, self.gid)

    def start(self) -> None:
        """Start and wait until it accepts connections."""
        log = str(self.log_path)
        self._pg("pg_ctl", "-D", str(self.data), "-l", log, "-o", self.options(), "-w", "-t", "60", "start")

    def options(self) -> str:
        """The server's options (port, socket directory, addresses it listens on)."""
        return f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=200"

    def stop(self, mode: str = "fast") -> None:
        """Stop (mode smart, fast or immediate) and wait until it is gone."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "immediate") -> None:
        """``pg_ctl restart -m <mode>``: every connection is cut; committed data must survive."""
        log = str(self.log_path)
        self._pg("pg_ctl", "-D", str(self.data), "-l", log, "-o", self.options(), "-m", mode, "-w", "restart")

    def running(self) -> bool:
        cmd = [*self.prefix, str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"]
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0

    def postmaster_pid(self) -> int | None:
        pidfile = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(pidfile.read_text().splitlines()[0])
        return None

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = DATABASE, autocommit: bool = True) -> Any:
        """A psycopg2 connection for the test's own reads and writes."""
        conn = psycopg2.connect(self.url(database), connect_timeout=5)
        conn.autocommit = autocommit
        return conn

    def shutdown(self) -> None:
        """Stop if running (immediate: the data is thrown away), killing the postmaster by pid if need be."""
        if self.data.exists() and self.running():
            try:
                self.stop("immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                pid = self.postmaster_pid()
                if pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


class PrivateRedis:
    """A ``redis-server`` of our own: no persistence (a restart loses everything), or append-only.

    With ``appendonly=True`` it writes every change to an append-only file (fsync every second,
    Redis's default) and reloads it when it starts again, as a production Redis does: a graceful
    restart (``restart(graceful=True)``, SIGTERM) keeps everything, a crash (SIGKILL) up to the
    last second.
    """

    def __init__(self, base: Path, port: int | None = None, *, appendonly: bool = False) -> None:
        self.base = base
        self.port = port or free_port()
        self.appendonly = appendonly
        self.log_path = base / "redis.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "no"]
        if self.appendonly:
            persistence = ["--appendonly", "yes", "--appendfsync", "everysec"]
        argv = [
            shutil.which("redis-server") or "redis-server",
            "--port", str(self.port), *self.bind_args(), "--save", "", *persistence,
            "--dir", str(self.base), "--logfile", str(self.log_path), "--daemonize", "no",
        ]  # fmt: skip
        self.popen = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
        harness.wait_for(self._pings, 30, 0.05, message=f"redis-server on port {self.port}")

    def bind_args(self) -> list[str]:
        """The addresses it listens on (loopback only)."""
        return ["--bind", "127.0.0.1"]

    def _pings(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL the server (by its pid): whatever it held is gone, like a crash without persistence."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self.popen = None

    def stop(self) -> None:
        """SIGTERM the server and wait: a graceful shutdown (an append-only server writes its file first)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            self.popen.wait(30)
        self.popen = None

    def restart(self, down_seconds: float = 0.0, *, graceful: bool = False) -> None:
        """Kill (or, ``graceful``, stop), optionally stay down, and start again on the same port."""
        if graceful:
            self.stop()
        else:
            self.kill()
        time.sleep(down_seconds)
        self.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db), socket_timeout=5, socket_connect_timeout=5)


def migrate(database_url: str, log_path: Path) -> None:
    """``manage.py migrate`` in a subprocess against ``database_url``."""
    env = harness.base_env({"DATABASE_URL": database_url, "CELERY_BROKER_URL": "redis://127.0.0.1:1/0"})
    with log_path.open("ab") as log:
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=harness.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"migrate failed; see {log_path}")


class Stack:
    """One test's private PostgreSQL and Redis, and a ``harness.Cluster`` pointed at them."""

    def __init__(self, pg: PrivatePostgres, broker: PrivateRedis, cluster: harness.Cluster) -> None:
        self.pg = pg
        self.redis = broker
        self.cluster = cluster
        self._conn: Any = None

    # -- the test's own view of the private database (psycopg2, reconnecting after faults) --

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement on the private database and return its rows (reconnects if needed)."""
        for attempt in range(2):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self.pg.connect()
                with self._conn.cursor() as cur:
                    cur.execute(statement, params)
                    return cur.fetchall() if cur.description else []
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                with contextlib.suppress(psycopg2.Error):
                    self._conn.close()
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def value(self, statement: str, params: Any = None) -> Any:
        return self.sql(statement, params)[0][0]

    def schedule(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        delay: float = 0.0,
        lease_seconds: int = 60,
        max_attempts: int = 5,
        key: str | None = None,
    ) -> int:
        """Insert a pending job with the platform's own ``insert_job`` statement; returns its id."""
        params = {
            "kind": kind,
            "payload": json.dumps(payload),
            "due_at": None,
            "delay": float(delay),
            "lease_seconds": lease_seconds,
            "max_attempts": max_attempts,
            "key": key,
            "owner_id": None,
            "priority": 0,
            **store.NO_OVERRIDES.params(),
            "unique_key": None,  # no uniqueness window
            "unique_states": None,
        }
        return int(self.sql(store.SQL["insert_job"], params)[0][0])

    def manage(self, *args: str, timeout: float = 120) -> str:
        """Run ``manage.py <args>`` against the private servers (as the processes see them); its stdout."""
        done = support.manage(*args, env=harness.base_env(self.cluster.env), timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return done.stdout

    def states(self) -> dict[str, int]:
        return dict(self.sql("SELECT state, count(*) FROM scheduling_scheduledjob GROUP BY state"))

    def executions_per_key(self) -> dict[str, int]:
        return dict(self.sql("SELECT idempotency_key, count(*) FROM tasks_execution GROUP BY idempotency_key"))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg2.Error):
                self._conn.close()
            self._conn = None


def stack_env(pg: PrivatePostgres, broker: PrivateRedis, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment overrides that point Celery processes at the private servers."""
    return {
        "DATABASE_URL": pg.url(),
        "CELERY_BROKER_URL": broker.url(),
        "CELERY_BROKER_KEYPREFIX": getattr(settings, "CELERY_BROKER_KEYPREFIX", ""),
        **(extra or {}),
    }


def _scratch_dir(prefix: str) -> Path:
    """A temporary directory the PostgreSQL user can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TIMEKEEPER_PRIVATE_TMP", "/tmp")))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[Path]:
    """A stopped, migrated PostgreSQL data directory that each test copies (initdb + migrate once)."""
    base = _scratch_dir("tk-pg-template-")
    pg = PrivatePostgres(base)
    try:
        pg.initdb()
        pg.start()
        conn = pg.connect("postgres")
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DATABASE}")
        conn.close()
        migrate(pg.url(), base / "migrate.log")
        pg.stop("fast")
        yield pg.data
    finally:
        pg.shutdown()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def private_stack(request: pytest.FixtureRequest, pg_template: Path) -> Iterator[Stack]:
    """A private PostgreSQL (migrated) and Redis for one test; ``stack.cluster`` starts processes on them."""
    base = _scratch_dir("tk-private-")
    log_dir = harness.ARTIFACTS / "e2e" / request.node.name.replace("/", "_").replace("[", "_").replace("]", "")
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("*"):
        if old.is_file():
            old.unlink()
    pg = PrivatePostgres(base / "pg")
    # A test module sets REDIS_APPENDONLY = True for a Redis that keeps its data across restarts.
    broker = PrivateRedis(base / "redis", appendonly=bool(getattr(request.module, "REDIS_APPENDONLY", False)))
    cluster = harness.Cluster(log_dir, env=stack_env(pg, broker))
    stack = Stack(pg, broker, cluster)
    try:
        pg.copy_from(pg_template)
        pg.start()
        broker.start()
        yield stack
    finally:
        stack.close()
        cluster.stop()
        broker.kill()
        pg.shutdown()
        for name, path in (("postgres.log", pg.log_path), ("redis.log", broker.log_path)):
            if path.exists():
                shutil.copyfile(path, log_dir / name)
        shutil.rmtree(base, ignore_errors=True)


def record_result(name: str, result: Mapping[str, Any]) -> None:
    """Merge one fault's measurements into tests/artifacts/faults-servers.json and print them."""
    ARTIFACT_FILE.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    if ARTIFACT_FILE.exists():
        with contextlib.suppress(ValueError):
            data = json.loads(ARTIFACT_FILE.read_text())
    data[name] = {**result, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    ARTIFACT_FILE.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    print(f"\n[{name}] " + json.dumps(result, sort_keys=True, default=str), flush=True)


class PgBouncer:
    """Debian's PgBouncer in ``pool_mode`` (transaction by default) on a free port, in front of one database.

    Runs as the PostgreSQL user when we are root (PgBouncer refuses to run as root). Clients log in
    as any user listed in its auth file with no password (``auth_type = trust``); ``options`` (the
    project's statement timeout) is ignored as a startup parameter, as a hosted pooler does.
    ``stats()`` reads its admin console (``SHOW STATS``).
    """

    def __init__(
        self, base: Path, *, host: str, port: int, database: str, user: str, pool_mode: str = "transaction"
    ) -> None:
        from tests import system_packages

        self.binary = system_packages.ensure("pgbouncer", "/usr/sbin/pgbouncer")
        self.base = base
        self.port = free_port()
        self.database = database
        self.user = user
        self.log_path = base / "pgbouncer.log"
        self.prefix, self.uid, self.gid = _run_as()
        self.popen: subprocess.Popen[bytes] | None = None
        base.mkdir(parents=True, exist_ok=True)
        (base / "userlist.txt").write_text(f'"{user}" ""\n')
        (base / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"{database} = host={host} port={port} dbname={database}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {base / 'userlist.txt'}\nadmin_users = {user}\n"
            f"pool_mode = {pool_mode}\ndefault_pool_size = 20\nmax_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log_path}\npidfile = {base / 'pgbouncer.pid'}\n"
        )
        _chown_tree(base, self.uid, self.gid)

    def start(self) -> None:
        argv = [*self.prefix, str(self.binary), str(self.base / "pgbouncer.ini")]
        quiet = subprocess.DEVNULL
        self.popen = subprocess.Popen(argv, start_new_session=True, stdout=quiet, stderr=quiet)
        harness.wait_for(self._answers, 30, 0.1, message=f"pgbouncer on port {self.port}")

    def _answers(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            raise AssertionError(f"pgbouncer exited with {self.popen.returncode}:\n{log[-3000:]}")
        try:
            psycopg2.connect(self.url(), connect_timeout=2).close()
        except psycopg2.OperationalError:
            return False
        return True

    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW <what>`` on the admin console (STATS, CLIENTS, SERVERS, ...), one dict per line."""
        conn = psycopg2.connect(f"postgresql://{self.user}@127.0.0.1:{self.port}/pgbouncer", connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(f"SHOW {what}")
                names = [column[0] for column in cur.description]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            conn.close()

    def stats(self) -> dict[str, int]:
        """This database's line of ``SHOW STATS`` (total_xact_count, total_query_count, ...)."""
        for line in self.show("STATS"):
            if line["database"] == self.database:
                return {k: int(v) for k, v in line.items() if k != "database"}
        return {}

    def clients(self) -> int:
        """Client connections to this database now (``SHOW CLIENTS``)."""
        return sum(1 for line in self.show("CLIENTS") if line["database"] == self.database)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.popen = None
