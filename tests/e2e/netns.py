"""A second "host" on this machine: a network namespace joined to the root namespace by a veth pair.

Used by the host-loss tests (``tests/e2e/core/test_faults_hosts.py``) and the chaos soak's
``host_loss`` fault (``bench/chaos.py``). A private /30 in 10.213.x.y: the root side's address
(``Link.server``) is where the private PostgreSQL and Redis listen (``VethPostgres``,
``VethRedis``), the namespace side's (``Link.client``) is what the servers see of the processes
started inside (``Link.run_inside()`` + argv). ``Link.cut()`` sets the namespace's end down: no FIN
and no RST reaches the servers, as when a node is lost; ``Link.heal()`` sets it up again.
Root and a kernel that allows network namespaces are needed (``refused()`` says why not).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e import private_services


def ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=check)


def refused() -> str | None:
    """Why this machine cannot make network namespaces (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2 (ip) is not installed"
    probe = f"tkprobe{os.getpid() % 100000}"
    done = ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"the kernel refuses network namespaces: {done.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@dataclass
class Link:
    """A namespace ``ns`` joined by veth ``outer`` (root side, ``server``) / ``inner`` (namespace side, ``client``)."""

    ns: str
    outer: str
    inner: str
    server: str
    client: str

    def run_inside(self) -> list[str]:
        """The argv prefix that runs a command inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns]

    def cut(self) -> None:
        """Take the namespace's end of the link down: silence, no FIN and no RST reach the servers.

        (``tc ... netem loss 100%`` would be the closer copy of a lost node, but kernels built
        without sch_netem refuse it; a link set down on the lost host's side is silent as well.)
        """
        ip("netns", "exec", self.ns, "ip", "link", "set", self.inner, "down")

    def heal(self) -> None:
        ip("netns", "exec", self.ns, "ip", "link", "set", self.inner, "up")


def make_link(name: str) -> Link:
    """A namespace (made if missing) and a new veth pair into it, in a random private 10.213.x.y/30."""
    block = random.randrange(0, 64) * 4
    third = random.randrange(1, 255)
    ns = name.rstrip("ab")
    link = Link(ns, f"{name}o", f"{name}i", f"10.213.{third}.{block + 1}", f"10.213.{third}.{block + 2}")
    if ip("netns", "exec", ns, "true", check=False).returncode != 0:
        ip("netns", "add", ns)
    ip("link", "add", link.outer, "type", "veth", "peer", "name", link.inner)
    ip("link", "set", link.inner, "netns", link.ns)
    ip("addr", "add", f"{link.server}/30", "dev", link.outer)
    ip("link", "set", link.outer, "up")
    inside = ["netns", "exec", link.ns, "ip"]
    ip(*inside, "addr", "add", f"{link.client}/30", "dev", link.inner)
    ip(*inside, "link", "set", link.inner, "up")
    ip(*inside, "link", "set", "lo", "up")
    return link


def remove(link: Link) -> None:
    """Delete the namespace (its veth end goes with it) and the root side's end."""
    ip("netns", "del", link.ns, check=False)
    ip("link", "del", link.outer, check=False)


def tag() -> str:
    """A short name for this process's namespace (interface names are limited to 15 characters)."""
    return f"tkh{os.getpid() % 10000}{random.randrange(100)}"


class VethPostgres(private_services.PrivatePostgres):
    """The private PostgreSQL, also listening on the veth address, trusting the /30."""

    def __init__(self, base: Path, address: str, port: int | None = None) -> None:
        super().__init__(base, port)
        self.address = address

    def options(self) -> str:
        return f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1,{self.address} -c max_connections=200"

    def start(self) -> None:
        hba = self.data / "pg_hba.conf"
        network = self.address.rsplit(".", 1)[0] + f".{int(self.address.rsplit('.', 1)[1]) - 1}/30"
        rule = f"host all all {network} trust"
        if rule not in hba.read_text():
            with hba.open("a") as out:
                out.write(f"\n{rule}\n")
        super().start()

    def url(self, database: str = private_services.DATABASE) -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/{database}"


class VethRedis(private_services.PrivateRedis):
    """The private Redis, also listening on the veth address (protected mode off: no password here)."""

    def __init__(self, base: Path, address: str, port: int | None = None, *, appendonly: bool = False) -> None:
        super().__init__(base, port, appendonly=appendonly)
        self.address = address

    def bind_args(self) -> list[str]:
        return ["--bind", "127.0.0.1", self.address, "--protected-mode", "no"]

    def url(self, db: int = 0) -> str:
        return f"redis://{self.address}:{self.port}/{db}"


HOLDER_SQL = (
    "SELECT host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.classid = ((%(key)s::bigint >> 32) & 4294967295)::oid"
    " AND l.objid = (%(key)s::bigint & 4294967295)::oid"
)


def holder(sql: Callable[[str, Any], list[tuple[Any, ...]]], key: int) -> str | None:
    """The client address of the session holding advisory lock ``key`` (None: nobody holds it)."""
    rows = sql(HOLDER_SQL, {"key": key})
    return str(rows[0][0]) if rows else None
