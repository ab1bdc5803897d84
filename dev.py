#!/usr/bin/env python3
"""Timekeeper's two commands. Standard library only: it must run with a bare ``python3``.

    python3 dev.py run [--verbose]   check the settings and servers, migrate, create the demo admin, load the
                                     demo data once, then run web, worker, beat and Flower until Ctrl-C
                                     (embedded PostgreSQL/Redis when none is configured or answering)
    python3 dev.py manage ARGS       manage.py ARGS on the PostgreSQL and Redis a running `dev.py run` uses
                                     (var/services.env), or chosen as run would choose them
    python3 dev.py test [ARGS]       check the settings and servers, then ruff check, makemigrations --check,
                                     mypy, the import-linter contracts, apt-get install Debian's chromium,
                                     faketime, pgbouncer, prometheus when missing (as root), and pytest
                                     ARGS (Django 5.2); stops at the first failure. With no ARGS, the whole
                                     suite in three lanes side by side (TEST_LANES; each line of output
                                     says its lane), the last one followed by the Django 6.0 leg
                                     (.venv-django60, Python 3.12: check, makemigrations --check and the
                                     Django-facing tests); every lane runs to its end
    A wrong setting or an unreachable server is one line and exit status 78; --verbose (run) or
    TIMEKEEPER_VERBOSE=1 (all) shows the traceback instead, and run's every line (each migration,
    Flower's inspect warnings, the production-only deferral-queue warning).

Each first makes sure ``.venv`` exists and holds the requirements (``requirements-embedded.txt`` for
run and manage, ``requirements-dev.txt`` for test; reinstalled only when a file changed, with a line
per package as pip collects it), then re-run
themselves with the venv's Python. The Django 6.0 leg has a venv of its own, ``.venv-django60``
(``requirements-django60.txt``, made with a Python 3.12 found on the machine), kept the same way.
Which PostgreSQL and Redis to use is decided by ``project.services.decide`` (configured >
reachable > embedded); ``project.preflight`` checks them.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # project imports Celery: dev.py imports it only once it runs in the venv
    from project import processes

ROOT = Path(__file__).resolve().parent
FLOWER_CONF = ROOT / "flowerconfig.py"  # Flower's configuration file: /metrics behind the basic auth
VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
VAR = ROOT / "var"
# requirements-embedded.txt is the runtime (requirements.txt) plus the embedded servers; the test
# requirements include it. The production image installs requirements.txt alone.
REQUIREMENTS = {"run": ROOT / "requirements-embedded.txt", "test": ROOT / "requirements-dev.txt"}
STOP_GRACE_SECONDS = 10  # how long children get to finish after SIGTERM before SIGKILL
ANSWER_TIMEOUT_SECONDS = 120  # how long run waits for the admin and Flower to answer before printing their URLs
SERVICES_FILE = VAR / "services.env"  # the servers a running `dev.py run` uses, for `dev.py manage`
# pip's lines shown while it installs (one or two per package); the rest only when pip fails.
PIP_SHOWN = (
    "Collecting ",
    "Downloading ",
    "Building wheel",
    "Installing collected",
    "Successfully",
    "ERROR",
    "WARNING",
)
PIP_TAIL_LINES = 40  # of pip's output, shown when it fails
# Children's lines that need no action in development, shown only with --verbose: Flower asking
# workers that have not started yet, and the deferral-queue warning meant for production workers.
QUIET_LINES = {
    "flower": ("WARNING flower.inspector Inspect method ",),
    "worker": ("This worker consumes the deferral queue ",),
}
PYTEST_NO_TESTS = 5  # pytest's exit status when it collected nothing
# The Django 6.0 leg of `dev.py test` (a whole-suite run): Django 6.0 needs Python 3.12 or newer.
DJANGO60_VENV = ROOT / ".venv-django60"
DJANGO60_REQUIREMENTS = ROOT / "requirements-django60.txt"
DJANGO60_MIN_PYTHON = (3, 12)
# The parts that touch Django's APIs, run again on 6.0 (the whole suite runs on 5.2): the Tasks
# backend (conformance and a real worker), the test helpers, the admin and dashboard, the HTTP
# APIs and their OpenAPI document, migrations, the system checks and settings, and the unit tests.
DJANGO60_TESTS = [
    "tests/unit",
    "tests/integration/backends/test_backends.py",
    "tests/integration/backends/test_backends_abort.py",
    "tests/conformance",
    "tests/integration/due_at/test_testing.py",
    "tests/e2e/backends/test_backends_worker.py",
    "tests/integration/web/test_admin.py",
    "tests/integration/web/test_admin_job_page.py",
    "tests/integration/web/test_admin_permissions.py",
    "tests/integration/web/test_dashboard.py",
    "tests/integration/web/test_jobs_api.py",
    "tests/integration/web/test_kinds_doors.py",
    "tests/integration/web/test_authorization.py",
    "tests/integration/web/test_jobs_api_openapi.py",
    "tests/integration/web/test_paging.py",
    "tests/integration/due_at/test_api.py",
    "tests/integration/core/test_migrations.py",
    "tests/integration/project/test_security.py",
    "tests/e2e/project/test_security.py",
    "tests/integration/project/test_preflight.py",
    "tests/integration/project/test_settings_production.py",
    "tests/integration/project/test_compose.py",
    "tests/integration/project/test_dev.py",
    "tests/integration/project/test_prometheus.py",
]
# Pure Python with no Django in it, and pinned to cronsim's behaviour: the 5.2 run covers it.
DJANGO60_IGNORED = ["--ignore=tests/unit/fixed/test_cron_differential.py"]
# The whole suite runs as these pytest runs side by side (``dev.py test`` with no ARGS). Most of an
# e2e test's time is spent waiting on real processes (a lease to run out, a beat to tick, a server to
# come back): one after the other the suite took 29 minutes of which 15 on a CPU. Each pytest process
# is a test run of its own, with its own database and Redis key prefix (tests/settings.py), so lanes
# share no table and no queue. The last lane, CPU-bound, goes on with the Django 6.0 leg. Together
# the lanes are pyproject's testpaths (tests/unit/project/test_dev.py checks).
E2E_FIRST_LANE = ["tests/e2e/core", "tests/e2e/project"]
TEST_LANES = {
    "e2e-1": E2E_FIRST_LANE,
    "e2e-2": ["tests/e2e", *(f"--ignore={path}" for path in E2E_FIRST_LANE)],
    "rest": ["tests/unit", "tests/integration", "tests/conformance", "tests/browser"],
}


class Output:
    """Where dev.py's own lines go: standard output, or standard error for ``manage`` (its output is the command's)."""

    stream: TextIO | None = None  # None: sys.stdout as it is when a line is written


def say(message: str) -> None:
    """Print one of dev.py's own lines, set apart from the children's output."""
    write(f"==> {message}\n")


def write(text: str) -> None:
    """Write to our output; once whoever reads it is gone (``dev.py run | tee``, then Ctrl-C), write nowhere.

    A closed pipe must not stop dev.py halfway through stopping its children: they would be orphaned.
    """
    stream = Output.stream or sys.stdout
    try:
        stream.write(text)
        stream.flush()
    except (BrokenPipeError, ValueError):
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # later writes and the exit flush


# --- Stage 1: the virtualenv (bare python3) ------------------------------------------------------


def included_requirements(path: Path) -> list[Path]:
    """The requirements files ``path`` includes with ``-r``, directly or through another."""
    included = []
    for line in path.read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) == 2 and parts[0] in {"-r", "--requirement"}:
            child = path.parent / parts[1]
            included += [child, *included_requirements(child)]
    return included


def requirements_digest(path: Path) -> str:
    """A hash of a requirements file and every file it includes with ``-r``."""
    digest = hashlib.sha256()
    for line in path.read_text().splitlines():
        digest.update(line.encode() + b"\n")
        parts = line.split("#", 1)[0].split()
        if len(parts) == 2 and parts[0] in {"-r", "--requirement"}:
            digest.update(requirements_digest(path.parent / parts[1]).encode())
    return digest.hexdigest()


def stamp_path(requirements: Path, venv: Path | None = None) -> Path:
    """Where the venv (``.venv`` unless named) records the digest of ``requirements`` it was last installed from."""
    return (venv or VENV) / f".installed-{requirements.name}.sha256"


def ensure_venv(command: str) -> None:
    """Create ``.venv`` if missing and install the command's requirements if they changed."""
    if not VENV_PYTHON.exists():
        say(f"creating the virtualenv in {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    requirements = REQUIREMENTS[command]
    stamp = stamp_path(requirements)
    if stamp.exists() and stamp.read_text().strip() == requirements_digest(requirements):
        return
    say(f"installing {requirements.name} into .venv (a line per package pip collects)")
    install_requirements(VENV_PYTHON, requirements)
    # pip installed every included file too (requirements-dev.txt > requirements-embedded.txt >
    # requirements.txt): the other command need not install them again.
    for path in [requirements, *included_requirements(requirements)]:
        stamp_path(path).write_text(requirements_digest(path) + "\n")


def pip_line(line: str) -> str | None:
    """The part of a line of pip's output to show while it installs, or None to keep it back."""
    text = line.strip()
    return text if text.startswith(PIP_SHOWN) else None


def install_requirements(python: Path, requirements: Path) -> None:
    """``pip install -r requirements`` with ``python``, showing a line per package; its last lines when it fails."""
    argv = [str(python), "-m", "pip", "install", "--progress-bar", "off", "-r", str(requirements)]
    tail: collections.deque[str] = collections.deque(maxlen=PIP_TAIL_LINES)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            tail.append(line)
            shown = pip_line(line)
            if shown:
                write(f"    pip | {shown}\n")
    if pip.returncode:
        write("".join(f"    pip | {line}" for line in tail))
        raise subprocess.CalledProcessError(pip.returncode, argv)


def find_python312() -> str | None:
    """A Python 3.12+ for the Django 6.0 leg: ``TIMEKEEPER_PYTHON312``, ``python3.12`` on PATH, or pyenv's."""
    candidates = [os.environ.get("TIMEKEEPER_PYTHON312", ""), shutil.which("python3.12") or ""]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python3"))
    candidates += ["/usr/bin/python3.12", "/usr/local/bin/python3.12"]
    wanted = f"import sys; sys.exit(sys.version_info[:2] < {DJANGO60_MIN_PYTHON!r})"
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            probe = subprocess.run([candidate, "-c", wanted], capture_output=True)
            if probe.returncode == 0:
                return candidate
    return None


def ensure_django60_venv() -> Path | None:
    """``.venv-django60`` with ``requirements-django60.txt`` (installed again only when it changed); its python."""
    python = DJANGO60_VENV / "bin" / "python"
    if not python.exists():
        base = find_python312()
        if base is None:
            say("the Django 6.0 leg needs Python 3.12 or newer: none found (set TIMEKEEPER_PYTHON312)")
            return None
        say(f"creating the Django 6.0 virtualenv in {DJANGO60_VENV} with {base}")
        subprocess.run([base, "-m", "venv", str(DJANGO60_VENV)], check=True)
    stamp = stamp_path(DJANGO60_REQUIREMENTS, DJANGO60_VENV)
    if not (stamp.exists() and stamp.read_text().strip() == requirements_digest(DJANGO60_REQUIREMENTS)):
        say(f"installing {DJANGO60_REQUIREMENTS.name} into {DJANGO60_VENV.name}")
        install_requirements(python, DJANGO60_REQUIREMENTS)
        stamp.write_text(requirements_digest(DJANGO60_REQUIREMENTS) + "\n")
    return python


def django60_steps(python: Path) -> list[tuple[str, list[str]]]:
    """The Django 6.0 leg: the system checks, makemigrations --check and the Django-facing tests."""
    return [
        ("Django 6.0: check", [str(python), "manage.py", "check"]),
        ("Django 6.0: makemigrations --check", [str(python), "manage.py", "makemigrations", "--check", "--dry-run"]),
        ("Django 6.0: pytest", [str(python), "-m", "pytest", *DJANGO60_TESTS, *DJANGO60_IGNORED]),
    ]


def in_venv() -> bool:
    """Whether this interpreter is the project's venv."""
    return Path(sys.prefix).resolve() == VENV.resolve()


# --- Stage 2: services (inside the venv) -------------------------------------------------------


class Services:
    """The PostgreSQL and Redis a command uses, starting embedded ones when the plan says so.

    Nothing starts before the configuration is checked: the variables first, then the configured
    servers (a ``preflight.PreflightError`` names what to fix), then the embedded ones if needed.
    """

    def __init__(self, purpose: str) -> None:
        from project import preflight, services

        self.embedded: list[services.EmbeddedPostgres | services.EmbeddedRedis] = []
        preflight.check_environment(os.environ)
        try:
            plan = services.decide(os.environ, services.tcp_probe, purpose=purpose)
            redis_port = port_setting("TIMEKEEPER_REDIS_PORT", 0, minimum=0)
        except ValueError as exc:
            raise preflight.PreflightError(str(exc)) from exc
        if plan.database.source == services.CONFIGURED:
            preflight.check_database(plan.database.url or "")
        if plan.broker.source == services.CONFIGURED:
            preflight.check_broker(plan.broker.url or "")
        redis_db = services.TEST_REDIS_DB if purpose == "test" else services.RUN_REDIS_DB
        try:
            self.database_url = plan.database.url
            if plan.database.source == services.EMBEDDED:
                say(f"nothing answers on PostgreSQL's default port: starting embedded PostgreSQL ({VAR / 'pgdata'})")
                postgres = services.EmbeddedPostgres(VAR / "pgdata")
                self.embedded.append(postgres)
                self.database_url = postgres.url()
            if plan.database.source != services.CONFIGURED:
                self._ensure_database(self.database_url)
            self.broker_url = plan.broker.url
            if plan.broker.source == services.EMBEDDED:
                say(f"nothing answers on Redis's default port: starting embedded Redis ({VAR / 'redis'})")
                redis_server = services.EmbeddedRedis(VAR / "redis", redis_port)
                self.embedded.append(redis_server)
                self.broker_url = redis_server.url(redis_db)
            elif plan.broker.source == services.REACHABLE:
                preflight.check_broker(self.broker_url or "")  # something answers: is it a Redis we may use?
        except BaseException:
            self.stop()
            raise
        say(services.describe(plan.database, self.database_url))
        say(services.describe(plan.broker, self.broker_url))

    @staticmethod
    def _ensure_database(url: str | None) -> None:
        """Create the timekeeper database on the machine's or the embedded server, or say in one line why not."""
        import psycopg2

        from project import preflight, redaction, services

        try:
            if services.ensure_database(url or ""):
                say(f"created database {services.DATABASE_NAME!r}")
        except psycopg2.Error as exc:
            first_line = (str(exc).strip().splitlines() or ["unknown error"])[0]
            raise preflight.PreflightError(
                f"DATABASE_URL is not set, and the PostgreSQL answering at {redaction.redact(url or '')} cannot be "
                f"used ({redaction.redact(first_line)}): set DATABASE_URL to a database you may use."
            ) from exc

    def stop(self) -> None:
        """Stop the embedded servers this process started (newest first)."""
        while self.embedded:
            server = self.embedded.pop()
            say(f"stopping embedded {server.name}")
            server.stop()


def port_setting(name: str, default: int, *, minimum: int = 1) -> int:
    """A TCP port from the environment, ``default`` when unset; ValueError naming the variable otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not minimum <= int(raw) < 65536:
        raise ValueError(f"{name}={raw!r} is not a TCP port: use a number from {max(minimum, 1)} to 65535.")
    return int(raw)


def manage(*args: str, env: dict[str, str] | None = None) -> None:
    """Run ``manage.py`` with the venv's Python; exit with its status if it fails."""
    from project import preflight

    status = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env).returncode
    if status:
        if status != preflight.EXIT_CONFIG:  # a configuration error: manage.py printed its one line
            say(f"manage.py {' '.join(args[:1])} failed with status {status}")
        raise SystemExit(status)


def raise_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt so that ``finally`` blocks stop everything."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


# --- test ----------------------------------------------------------------------------------------


# Debian packages the test suite drives: (package, a file it installs). Chromium for the browser
# tests; libfaketime for the clock-skew fault test (a worker whose clock is ten minutes ahead);
# PgBouncer for the transaction-pooler e2e test; prometheus for promtool (the alert rules' tests).
# (Those two tests' fixtures install them too, via tests/system_packages.py, when run alone.)
SYSTEM_PACKAGES = [
    ("chromium", Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))),
    ("faketime", Path("/usr/bin/faketime")),
    ("pgbouncer", Path("/usr/sbin/pgbouncer")),
    ("prometheus", Path("/usr/bin/promtool")),
    ("redis-sentinel", Path("/usr/bin/redis-sentinel")),
]


def ensure_system_packages() -> int:
    """Install the Debian packages the tests need (as root, with apt-get) when they are missing."""
    missing = [name for name, path in SYSTEM_PACKAGES if not path.exists()]
    if not missing:
        return 0
    if not shutil.which("apt-get") or os.geteuid() != 0:
        say(f"missing {', '.join(missing)} and cannot install them here (needs root and apt-get)")
        return 1
    say(f"installing Debian's {', '.join(missing)} for the tests (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        status = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL).returncode
        if status:
            return status
    return 0


def command_test(pytest_args: list[str]) -> int:
    """ruff, makemigrations --check, mypy, pytest: the first failure's status, or 0."""
    from project import preflight

    raise_on_sigterm()
    os.environ.setdefault("DEBUG", "1")
    with preflight.exit_on_error(prefix="==> "):
        services = Services("test")
    try:
        os.environ.update(DATABASE_URL=services.database_url, CELERY_BROKER_URL=services.broker_url)
        # Importing the project package (for project.services) set DJANGO_SETTINGS_MODULE to the
        # project's settings; pytest-django would prefer it to pyproject's tests.settings.
        os.environ.pop("DJANGO_SETTINGS_MODULE", None)
        steps = [
            ("ruff", [sys.executable, "-m", "ruff", "check", "."]),
            ("makemigrations --check", [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"]),
            ("mypy", [sys.executable, "-m", "mypy", "scheduling", "tasks"]),
            ("import contracts", [str(Path(sys.executable).with_name("lint-imports"))]),
            ("system packages", []),
        ]
        if pytest_args:  # a selection is the user's, on 5.2, in one run
            steps.append(("pytest", [sys.executable, "-m", "pytest", *pytest_args]))
        for name, argv in steps:
            if name == "system packages":
                status = ensure_system_packages()
            else:
                say(f"{name}: {' '.join(argv[1:])}")
                status = subprocess.run(argv, cwd=ROOT).returncode
            if name == "pytest" and status == PYTEST_NO_TESTS:
                status = 0  # a selection that matches nothing is the user's choice; the whole suite must not be empty
            if status:
                say(f"{name} failed with status {status}")
                return status
        if not pytest_args:  # the whole suite, and Django 6.0 too
            status = Lanes().run()
            if status:
                return status
        say("all checks passed")
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        services.stop()


class Lanes:
    """The whole suite's pytest runs side by side (``TEST_LANES``), the last one followed by the Django 6.0 leg.

    Each lane's output goes through here a line at a time, headed by its name. Every lane runs to its
    end (a failure in one stops that lane only); the status is the first failed step's, else 0.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failures: list[tuple[str, str, int]] = []  # (lane, step, status)
        self.children: list[subprocess.Popen[str]] = []

    def run(self) -> int:
        names = list(TEST_LANES)
        threads = [
            threading.Thread(target=self.lane, args=(name, name == names[-1]), name=f"lane-{name}") for name in names
        ]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)  # in steps: Ctrl-C (or SIGTERM, as KeyboardInterrupt) is seen here
        except KeyboardInterrupt:
            for child in self.children:
                with contextlib.suppress(OSError):
                    child.send_signal(signal.SIGINT)  # pytest stops and its fixtures stop their processes
            for thread in threads:
                thread.join(STOP_GRACE_SECONDS)
            raise
        for lane, step, status in self.failures:
            say(f"[{lane}] {step} failed with status {status}")
        return self.failures[0][2] if self.failures else 0

    def lane(self, name: str, then_django60: bool) -> None:
        steps = [("pytest", [sys.executable, "-m", "pytest", *TEST_LANES[name]])]
        if not self.step(name, *steps[0]):
            return
        if not then_django60:
            return
        python = ensure_django60_venv()
        if python is None:
            with self.lock:
                self.failures.append((name, "Django 6.0 venv", 1))
            return
        for step, argv in django60_steps(python):
            if not self.step(name, step, argv):
                return

    def step(self, lane: str, step: str, argv: list[str]) -> bool:
        """Run one step of ``lane``, its output headed by the lane's name; whether it passed."""
        self.say(lane, f"{step}: {' '.join(argv[1:])}")
        child = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        with self.lock:
            self.children.append(child)
        assert child.stdout is not None
        for line in child.stdout:
            with self.lock:
                write(f"[{lane}] {line}")
        status = child.wait()
        if status:
            with self.lock:
                self.failures.append((lane, step, status))
        self.say(lane, f"{step} {'failed with status ' + str(status) if status else 'passed'}")
        return status == 0

    def say(self, lane: str, message: str) -> None:
        with self.lock:
            say(f"[{lane}] {message}")


# --- run -----------------------------------------------------------------------------------------


LOGIN_FILE = "var/dev-password"  # relative to the checkout; its path is printed, never its content


def dev_password() -> str:
    """The demo admin / Flower password: generated once, kept in var/dev-password."""
    path = ROOT / LOGIN_FILE
    if not path.exists():
        VAR.mkdir(exist_ok=True)
        path.write_text(secrets.token_urlsafe(12) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def port_in_use(port: int) -> bool:
    """Whether something already listens on 127.0.0.1:``port``."""
    from project import services

    return services.tcp_probe("127.0.0.1", port)


CREATE_ADMIN = """
import os
from django.contrib.auth import get_user_model
User = get_user_model()
if User.objects.filter(username="admin").exists():
    print("demo superuser 'admin' exists (password unchanged)")
else:
    User.objects.create_superuser("admin", "admin@localhost", os.environ["DJANGO_SUPERUSER_PASSWORD"])
    print("created demo superuser 'admin'")
"""


def migrate(verbose: bool) -> None:
    """``manage.py migrate``: one line saying how many migrations it applied (each one with ``verbose``)."""
    if verbose:
        manage("migrate", "--noinput")
        return
    from project import preflight

    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        write(done.stdout + done.stderr)
        if done.returncode != preflight.EXIT_CONFIG:
            say(f"manage.py migrate failed with status {done.returncode}")
        raise SystemExit(done.returncode)
    say(migrate_summary(done.stdout))
    if done.stderr.strip():  # warnings of migrate's own (a model change without its migration) need action
        write(done.stderr)


def migrate_summary(output: str) -> str:
    """One line for ``migrate``'s output: how many migrations it applied, or that there was nothing to do."""
    applied = sum(1 for line in output.splitlines() if line.strip().startswith("Applying "))
    if not applied:
        return "database schema up to date"
    return f"applied {applied} migration{'' if applied == 1 else 's'} (--verbose lists them)"


def prepare_database(password: str) -> None:
    """Migrate, create the demo superuser in dev mode, and load the demo data when seed_demo exists."""
    from project import preflight

    migrate(preflight.verbose())
    if os.environ.get("DEBUG", "").lower() in {"1", "true", "yes", "on"}:
        # Only this one child gets the password, in its environment (never on a command line).
        admin_env = {**os.environ, "DJANGO_SUPERUSER_PASSWORD": password}
        manage("shell", "--verbosity", "0", "-c", CREATE_ADMIN, env=admin_env)
    if list(ROOT.glob("*/management/commands/seed_demo.py")):
        manage("seed_demo")
    else:
        say("no seed_demo command yet: skipping demo data")


COLOURS = ["36", "33", "35", "32"]  # the name prefix of each child's lines, on a terminal


def quiet_line(name: str, line: str) -> bool:
    """Whether child ``name``'s ``line`` needs no action in development (``QUIET_LINES``: kept for --verbose)."""
    return any(marker in line for marker in QUIET_LINES.get(name, ()))


def start_child(name: str, argv: list[str], index: int, group: int | None) -> processes.Process:
    """Start a supervised process whose output lines are printed with a name prefix, in process group ``group``."""
    prefix = f"{name:<7}| "
    if sys.stdout.isatty():
        prefix = f"\033[{COLOURS[index % len(COLOURS)]}m{prefix}\033[0m"
    from project import preflight, processes  # the supervisor tests and bench share; importable once in the venv

    everything = preflight.verbose()

    def show(line: str) -> None:
        if everything or not quiet_line(name, line):
            write(prefix + line)

    return processes.Process(name, argv, cwd=ROOT, on_line=show, group=0 if group is None else group)


def answers(url: str) -> bool:
    """Whether an HTTP server answers ``url`` (any status: Flower's 401 is an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - a 127.0.0.1 URL dev.py built
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def wait_until_answering(
    urls: list[str], children: list[processes.Process], timeout: float = ANSWER_TIMEOUT_SECONDS
) -> list[str]:
    """Poll ``urls`` until each answers; the ones still silent after ``timeout`` or once a child has exited."""
    deadline = time.monotonic() + timeout
    silent = list(urls)
    while silent and time.monotonic() < deadline and all(child.popen.poll() is None for child in children):
        silent = [url for url in silent if not answers(url)]
        if silent:
            time.sleep(0.25)
    return silent


def stop_children(children: list[processes.Process]) -> None:
    """SIGTERM each child (a warm shutdown for Celery), wait, then SIGKILL their whole process group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not children:
        return
    say("stopping web, worker, beat and Flower")
    from project import processes

    if not processes.stop_together(children, STOP_GRACE_SECONDS):
        say(f"still running after {STOP_GRACE_SECONDS} s: killed them")


def supervise(children: list[processes.Process]) -> int:
    """Wait until Ctrl-C / SIGTERM (status 0) or until a child exits on its own (non-zero)."""
    try:
        while True:
            for child in children:
                status = child.popen.poll()
                if status is not None:
                    say(f"{child.name} exited unexpectedly with status {status}: stopping everything")
                    return status if status > 0 else 128 - status if status < 0 else 1  # -N: killed by signal N
            time.sleep(0.2)
    except KeyboardInterrupt:
        write("\n")
        return 0


def child_commands(web_port: int, flower_port: int) -> dict[str, list[str]]:
    """The argv of each supervised process. No secret goes here: ``ps`` shows every argv to every user.

    Flower reads its ``user:password`` from ``FLOWER_BASIC_AUTH`` in its environment (Flower takes
    any option from a ``FLOWER_``-prefixed variable).
    """
    celery = [sys.executable, "-m", "celery", "-A", "project"]
    return {
        "web": [sys.executable, "manage.py", "runserver", f"127.0.0.1:{web_port}", "--noreload"],
        "worker": [*celery, "worker", "-l", "info", "--concurrency", "2", "-n", "worker1@%h"],
        "beat": [*celery, "beat", "-l", "info"],
        # --conf: flowerconfig.py puts Flower's /metrics behind the same basic auth (project/flower_auth.py).
        "flower": [*celery, "flower", f"--conf={FLOWER_CONF}", "--address=127.0.0.1", f"--port={flower_port}"],
    }


def command_run() -> int:
    """Bring up web, worker, beat and Flower as one process group; stop them all together."""
    from project import preflight

    raise_on_sigterm()
    os.environ.setdefault("DEBUG", "1")
    with preflight.exit_on_error(prefix="==> "):
        try:
            web_port = port_setting("WEB_PORT", 8000)
            flower_port = port_setting("FLOWER_PORT", 5555)
        except ValueError as exc:
            raise preflight.PreflightError(str(exc)) from exc
        for name, port in (("WEB_PORT", web_port), ("FLOWER_PORT", flower_port)):
            if port_in_use(port):
                raise preflight.PreflightError(f"{name}={port} is already in use: stop what runs there, or set {name}.")
        services = Services("run")
    children: list[processes.Process] = []
    try:
        password = dev_password()
        os.environ.update(
            DATABASE_URL=services.database_url, CELERY_BROKER_URL=services.broker_url, PYTHONUNBUFFERED="1"
        )
        flower_login = f"user admin, password in {LOGIN_FILE}"
        if os.environ.get("FLOWER_BASIC_AUTH"):
            flower_login = f"user {os.environ['FLOWER_BASIC_AUTH'].partition(':')[0]}, password from FLOWER_BASIC_AUTH"
        else:
            os.environ["FLOWER_BASIC_AUTH"] = f"admin:{password}"
        prepare_database(password)
        for index, (name, argv) in enumerate(child_commands(web_port, flower_port).items()):
            children.append(start_child(name, argv, index, children[0].pid if children else None))
        from project import services as services_module

        services_module.write_state(SERVICES_FILE, os.getpid(), os.environ)
        admin, flower = f"http://127.0.0.1:{web_port}/admin/", f"http://127.0.0.1:{flower_port}/"
        silent = wait_until_answering([f"{admin}login/", flower], children)
        if any(child.popen.poll() is not None for child in children):
            return supervise(children)  # says which one exited, and stops the rest
        later = "   (not answering yet)"
        say(f"admin    {admin}   (user admin, password in {LOGIN_FILE}){later if f'{admin}login/' in silent else ''}")
        say(f"Flower   {flower}   ({flower_login}){later if flower in silent else ''}")
        say(f"metrics  http://127.0.0.1:{web_port}/metrics")
        say(f"another terminal: python3 dev.py manage ...  (these servers, from {shown_path(SERVICES_FILE)})")
        say("Ctrl-C stops everything")
        return supervise(children)
    except KeyboardInterrupt:
        return 130
    finally:
        try:
            stop_children(children)
        finally:
            forget_services_file()
            services.stop()


def shown_path(path: Path) -> str:
    """``path`` as printed: relative to the checkout when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def forget_services_file() -> None:
    """Remove ``var/services.env`` if this process wrote it (a second run's file is not ours to remove)."""
    from project import services

    with contextlib.suppress(OSError):
        state = services.parse_state(SERVICES_FILE.read_text())
        if state is not None and state.pid == os.getpid():
            SERVICES_FILE.unlink()


# --- manage --------------------------------------------------------------------------------------


def command_manage(args: list[str]) -> int:
    """``manage.py ARGS`` on the servers of the running ``dev.py run``, or on those run would choose (started here)."""
    from project import preflight, redaction, services

    Output.stream = sys.stderr  # stdout is the command's own (``timekeeper status --json | jq``)
    raise_on_sigterm()
    os.environ.setdefault("DEBUG", "1")
    state, why_not = services.running_state(SERVICES_FILE)
    started = None
    if state is not None:
        kept = [name for name in state.variables if os.environ.get(name) and os.environ[name] != state.variables[name]]
        os.environ.update({name: value for name, value in state.variables.items() if name not in kept})
        say(f"using the servers of `python3 dev.py run` (pid {state.pid}, {shown_path(SERVICES_FILE)})")
        for name in kept:
            say(f"{name} is set here, so it wins over the run's: {redaction.redact(os.environ[name])}")
        say(f"PostgreSQL at {redaction.redact(os.environ['DATABASE_URL'])}")
        say(f"Redis at {redaction.redact(os.environ['CELERY_BROKER_URL'])}")
    else:
        say(f"{why_not}: choosing PostgreSQL and Redis as it would")
        with preflight.exit_on_error(prefix="==> "):
            started = Services("run")
    try:
        if started is not None:
            os.environ.update(DATABASE_URL=started.database_url or "", CELERY_BROKER_URL=started.broker_url or "")
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT).returncode
    except KeyboardInterrupt:
        return 130
    finally:
        if started is not None:
            started.stop()


# --- entry point ---------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """Dispatch ``run`` / ``manage`` / ``test``, moving into the venv first."""
    wrong_run = argv[:1] == ["run"] and argv[1:] not in ([], ["--verbose"])
    if len(argv) < 1 or argv[0] not in {*REQUIREMENTS, "manage"} or wrong_run or argv == ["manage"]:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0] == "run" and "--verbose" in argv:
        os.environ["TIMEKEEPER_VERBOSE"] = "1"  # kept across the exec into the venv, and seen by every child
    if sys.version_info < (3, 11):  # noqa: UP036 - this runs on the machine's python3, before the venv
        print(f"Timekeeper needs Python 3.11 or newer; this is {sys.version.split()[0]}.", file=sys.stderr)
        return 2
    command = argv[0]
    ensure_venv("run" if command == "manage" else command)
    if not in_venv():
        # Replace this process: the venv's Python carries on with the same arguments.
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(Path(__file__).resolve()), *argv])  # noqa: S606
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    if command == "manage":
        return command_manage(argv[1:])
    return command_test(argv[1:]) if command == "test" else command_run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
