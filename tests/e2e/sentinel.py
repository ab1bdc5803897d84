"""A private Redis under Sentinel: a primary, a replica and one sentinel (quorum 1), each a ``redis-server``.

Used by ``tests/e2e/core/test_faults_sentinel.py`` and the chaos soak's ``sentinel_failover`` fault
(``bench/chaos.py``). Processes reach it with ``CELERY_BROKER_URL=sentinel://host:port/0`` and
``CELERY_BROKER_MASTER_NAME`` (``env()``), as Celery documents. ``fail_over()`` SIGKILLs the
current primary and waits until the sentinel names another; ``rejoin()`` starts the killed server
again as a replica of the new primary, so that a later failover can happen. Debian's
``redis-sentinel`` is installed if missing (``tests/system_packages.py``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.e2e import harness
from tests.system_packages import ensure

MASTER = "tkmaster"


class Sentinels:
    """A primary, a replica and one sentinel on ``host`` (127.0.0.1, or an address a namespace reaches)."""

    def __init__(
        self, base: Path, host: str = "127.0.0.1", *, sentinel_port: int | None = None, down_after_ms: int = 1000
    ) -> None:
        from tests.e2e.private_services import free_port  # here: it imports the models (the bench sets up first)

        self.base = base
        self.host = host
        self.primary_port = free_port()
        self.replica_port = free_port()
        self.sentinel_port = sentinel_port or free_port()
        self.ports = {"primary": self.primary_port, "replica": self.replica_port}
        self.down_after_ms = down_after_ms  # the sentinel's down-after-milliseconds: a primary silent this long is down
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _bind(self) -> list[str]:
        extra = [self.host] if self.host != "127.0.0.1" else []
        return ["--bind", "127.0.0.1", *extra, "--protected-mode", "no"]

    def _server(self, name: str, *argv: str) -> None:
        folder = self.base / name
        folder.mkdir(parents=True, exist_ok=True)
        server = shutil.which("redis-server") or "redis-server"
        log = str(folder / "redis.log")
        plain = [*self._bind(), "--save", "", "--appendonly", "no"]
        self.procs[name] = subprocess.Popen(
            [server, "--port", str(self.ports[name]), *plain, *argv, "--dir", str(folder), "--logfile", log],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> None:
        ensure("redis-sentinel", "/usr/bin/redis-sentinel")
        self._server("primary")
        self._server("replica", "--replicaof", self.host, str(self.primary_port))
        conf = self.base / "sentinel.conf"
        bind = " ".join(self._bind()[1:-2])
        conf.write_text(
            f"port {self.sentinel_port}\nbind {bind}\nprotected-mode no\ndir {self.base}\n"
            f"sentinel monitor {MASTER} {self.host} {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} 5000\n"
        )
        sentinel = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
        self.procs["sentinel"] = subprocess.Popen(
            [sentinel, str(conf), "--logfile", str(self.base / "sentinel.log")],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )
        harness.wait_for(lambda: self.replicated(self.replica_port), 30, message="the replica to be in sync")
        harness.wait_for(lambda: self._sentinel_sees_replica(), 30, message="the sentinel to know the replica")

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host=self.host, port=port, socket_timeout=2, socket_connect_timeout=2)

    def replicated(self, port: int) -> bool:
        try:
            return self.client(port).info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False

    def _sentinel_sees_replica(self, port: int | None = None) -> bool:
        try:
            replicas = self.client(self.sentinel_port).execute_command("SENTINEL", "REPLICAS", MASTER)
        except redis.RedisError:
            return False
        if port is None:
            return bool(replicas)
        for entry in replicas or []:
            fields = dict(zip(entry[::2], entry[1::2], strict=False)) if isinstance(entry, list) else dict(entry)
            fields = {_text(k): _text(v) for k, v in fields.items()}
            if fields.get("port") == str(port) and "down" not in fields.get("flags", ""):
                return True
        return False

    def primary(self) -> int | None:
        """The port of the primary the sentinel names now."""
        try:
            _, port = self.client(self.sentinel_port).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        except (redis.RedisError, TypeError, ValueError):
            return None
        return int(port)

    def primary_client(self) -> redis.Redis:
        """A client of the current primary (the bench's own reads: held sets, the unacked hash)."""
        return self.client(self.primary() or self.primary_port)

    def url(self) -> str:
        return f"sentinel://{self.host}:{self.sentinel_port}/0"

    def env(self) -> dict[str, str]:
        """The broker settings of a process on this Redis."""
        return {"CELERY_BROKER_URL": self.url(), "CELERY_BROKER_MASTER_NAME": MASTER}

    def kill(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def fail_over(self, timeout: float = 60.0) -> tuple[str, float]:
        """SIGKILL the current primary; (its name, seconds until the sentinel named another)."""
        old = self.primary()
        name = next(n for n, p in self.ports.items() if p == old)
        killed_at = time.monotonic()
        self.kill(name)
        harness.wait_for(
            lambda: self.primary() not in (None, old), timeout, 0.1, message="the sentinel to promote the replica"
        )
        return name, round(time.monotonic() - killed_at, 1)

    def rejoin(self, name: str, timeout: float = 60.0) -> None:
        """Start ``name`` again (empty) as a replica of the current primary; wait until it is in sync and known."""
        primary = self.primary()
        self._server(name, "--replicaof", self.host, str(primary))
        port = self.ports[name]
        harness.wait_for(lambda: self.replicated(port), timeout, message=f"{name} to sync from the new primary")
        harness.wait_for(
            lambda: self._sentinel_sees_replica(port), timeout, message=f"the sentinel to see {name} as a replica"
        )

    def stop(self, log_dir: Path) -> None:
        for name in list(self.procs):
            self.kill(name)
        log_dir.mkdir(parents=True, exist_ok=True)
        for log in self.base.rglob("*.log"):
            shutil.copyfile(log, log_dir / f"redis-{log.parent.name}-{log.name}")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
