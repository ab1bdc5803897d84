"""System checks with stable ids, run by every ``manage.py`` command and at worker start.

- scheduling.E001: the default database is not PostgreSQL.
- scheduling.E002: Celery accepts or produces pickle (or any non-JSON content).
- scheduling.E003: the broker delay ceiling does not sit below the visibility timeout with a margin.
- scheduling.E004: no Celery app or no Redis broker is configured (Celery's fallback app would send
  to ``amqp://localhost``; ``defer()`` raises ``BrokerNotConfigured`` instead).
- scheduling.E005: ``django_celery_beat`` is not in ``INSTALLED_APPS``. Raised as
  ``ImproperlyConfigured`` while the apps load (``SchedulingConfig.import_models``): Timekeeper's
  models cannot load without it, so no check could run.
- scheduling.E006: a package named in ``SCHEDULING_HANDLER_PACKAGES`` cannot be imported.
- scheduling.E007: a lease (``SCHEDULING_LEASE_SECONDS``, or a kind's ``lease_seconds``) is not
  longer than the heartbeat interval (``SCHEDULING_HEARTBEAT_SECONDS``): healthy running jobs would
  be swept between two heartbeats and run again.
- scheduling.E011: Celery's worker pool (``CELERY_WORKER_POOL``, or ``--pool`` on the worker's command
  line: checked again at worker start) is not one that keeps a job's timeout and its claim's lease:
  ``threads`` runs tasks off the main thread, where no SIGALRM can stop a handler (and Celery's
  threads pool has no time limits); ``gevent`` and ``eventlet`` block their hub in psycopg2, so one
  slow statement stops every heartbeat of the worker. Supported: ``prefork`` (the default) and ``solo``.
- scheduling.W001: no job kind is registered (no installed app has a ``jobs.py`` with a handler).
- scheduling.W002: fixed-time schedules are declared but Celery beat's scheduler is not
  ``scheduling.fixed.beat:LeaderDatabaseScheduler`` (they would never fire).
- scheduling.W003: Celery cancels running late-acknowledged tasks when the broker connection is
  lost (``worker_cancel_long_running_tasks_on_connection_loss``, Celery 6's default): every Redis
  blip would throw away the running batches (``scheduling.core.reconnect`` lets them finish).
- scheduling.W005: a kind registered ``critical=True`` is open to the JSON API while one owner's
  pending quota (``SCHEDULING_API_MAX_PENDING_JOBS``, 0 = none) is not below
  ``SCHEDULING_HEALTH_MAX_BACKLOG``: a single caller could then flip ``/healthz`` to 503.
- scheduling.W007: the lock connection (``SCHEDULING_DIRECT_DATABASE_URL``, else the default
  database) appears to go through a transaction pooler: advisory locks, leadership and LISTEN need
  a session of their own. A database check: ``manage.py check --database default`` and ``migrate``.
- scheduling.W008: the default database appears to go through a transaction pooler while Django's
  server-side cursors are on (``DISABLE_SERVER_SIDE_CURSORS``). A database check too.
- scheduling.W006: on Django below 6.0, ``TASKS`` uses Timekeeper's backend but the
  ``django_tasks`` backport is not in ``INSTALLED_APPS`` (its system checks, scheduling.E009
  among them, and its task log lines do not run). scheduling.E009 itself is the backend's own
  check (``scheduling/backends.py``, ``TimekeeperBackend.check``), run through Django's tasks checks.
- scheduling.W015: the admin is installed but ``scheduling.web.middleware.AuditMiddleware`` is not in
  ``MIDDLEWARE`` (after ``AuthenticationMiddleware``): admin actions would leave no audit record.

Celery's settings are read from Celery's own configuration (``current_app.conf``), however the
project fills it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from celery.utils.imports import symbol_by_name
from django.core import checks
from django.db import connections

from scheduling.core import broker, conf, registry
from scheduling.deferrals import countdowns

TIMEKEEPER_BEAT_SCHEDULER = "scheduling.fixed.beat:LeaderDatabaseScheduler"
SUPPORTED_POOLS = ("prefork", "solo")  # tasks run on a main thread (SIGALRM) and psycopg2 blocks no one else
POOL_REASONS = {
    "threads": "it runs handlers off the main thread, where no timeout can stop them (and Celery's threads "
    "pool has no time limits)",
    "gevent": "psycopg2 blocks its hub: one slow statement stops every heartbeat, and live claims are swept",
    "eventlet": "psycopg2 blocks its hub: one slow statement stops every heartbeat, and live claims are swept",
}


@checks.register(checks.Tags.database, deploy=False)
def check_database_is_postgresql(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """SKIP LOCKED, advisory locks and partial indexes need PostgreSQL."""
    vendor = connections["default"].vendor
    if vendor != "postgresql":
        return [
            checks.Error(
                f"The default database is {vendor}; Timekeeper needs PostgreSQL.",
                hint="Set DATABASES['default'] to a django.db.backends.postgresql database.",
                id="scheduling.E001",
            )
        ]
    return []


@checks.register()
def check_json_only(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A pickle message from the broker is code execution; only JSON may be accepted or produced."""
    celery_conf = broker.app().conf
    accepted = [str(c).lower() for c in celery_conf.accept_content or ["json"]]
    result_accepted = [str(c).lower() for c in celery_conf.result_accept_content or accepted]
    bad = sorted({c for c in accepted + result_accepted if c not in {"json", "application/json"}})
    for name in ("task_serializer", "result_serializer"):
        value = str(celery_conf.get(name) or "json").lower()
        if value != "json":
            bad.append(f"CELERY_{name.upper()}={value}")
    if bad:
        return [
            checks.Error(
                f"Celery is configured to accept or produce non-JSON content: {', '.join(bad)}.",
                hint="Set CELERY_ACCEPT_CONTENT = ['json'] and the task/result serializers to 'json'.",
                id="scheduling.E002",
            )
        ]
    return []


@checks.register()
def check_delay_ceiling(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A countdown that outlives the visibility timeout is redelivered again and again (celery #2599, #4400)."""
    problem = countdowns.ceiling_problem()
    if problem is None:
        return []
    return [
        checks.Error(
            problem,
            hint="Lower the ceiling or raise the visibility timeout (CELERY_BROKER_TRANSPORT_OPTIONS"
            "['visibility_timeout']). Until this passes, workers refuse to start and defer() refuses such delays.",
            id="scheduling.E003",
        )
    ]


@checks.register()
def check_celery_app(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Without the project's Celery app, messages would go to Celery's default broker, amqp://localhost."""
    problem = broker.app_problem()
    if problem is None:
        return []
    return [
        checks.Error(
            problem,
            hint="Follow Celery's 'First steps with Django' (docs/installing.md shows the files). "
            "Until this passes, defer() raises BrokerNotConfigured.",
            id="scheduling.E004",
        )
    ]


@checks.register()
def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Handlers are found in each installed app's jobs.py and in SCHEDULING_HANDLER_PACKAGES."""
    for package_name in conf.get().handler_packages:
        try:
            importlib.import_module(package_name)
        except ImportError as exc:
            return [
                checks.Error(
                    f"SCHEDULING_HANDLER_PACKAGES names {package_name!r}, which cannot be imported ({exc}).",
                    hint="List only importable packages there, or drop the setting and put handlers in a jobs.py "
                    "module of an installed app.",
                    id="scheduling.E006",
                )
            ]
    if not registry.all_kinds():
        return [
            checks.Warning(
                "No job kind is registered: schedule() and defer() will refuse every kind.",
                hint="Write handlers with @registry.handler('app.kind') in <app>/jobs.py of an installed app "
                "(found like admin.py), or name their package in SCHEDULING_HANDLER_PACKAGES.",
                id="scheduling.W001",
            )
        ]
    return []


def pool_name(pool: Any) -> str:
    """The name of a Celery pool given as an alias (``"threads"``), a dotted path or a class."""
    from celery import concurrency

    if isinstance(pool, str):
        target = concurrency.ALIASES.get(pool, pool)
    else:
        target = f"{getattr(pool, '__module__', '')}:{getattr(pool, '__qualname__', '')}"
    for alias, path in concurrency.ALIASES.items():
        if target == path and alias != "processes":
            return alias
    if target == concurrency.ALIASES["processes"]:
        return "prefork"
    return target


def pool_problem(pool: Any) -> str:
    """Why a worker must not run tasks under ``pool`` (empty when it may): scheduling.E011."""
    from celery.concurrency import prefork

    if isinstance(pool, type) and issubclass(pool, prefork.TaskPool):
        return ""
    name = pool_name(pool)
    if name in SUPPORTED_POOLS:
        return ""
    reason = POOL_REASONS.get(name, "Timekeeper cannot tell whether it keeps a job's timeout and its claim's lease")
    return (
        f"the worker pool {name!r} is not supported: {reason}. Run workers with --pool prefork (the default; "
        "--concurrency for more processes) or --pool solo, and unset CELERY_WORKER_POOL if it names this pool."
    )


@checks.register()
def check_worker_pool(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Only prefork and solo keep a handler's timeout and its claim's heartbeat (docs/operations.md, pools)."""
    problem = pool_problem(broker.app().conf.worker_pool or "prefork")
    if not problem:
        return []
    return [
        checks.Error(
            problem[0].upper() + problem[1:],
            hint="Set CELERY_WORKER_POOL = 'prefork' (or 'solo'). Until this passes, workers refuse to start.",
            id="scheduling.E011",
        )
    ]


def lease_problems(settings: conf.Settings, kinds: Mapping[str, registry.Kind]) -> list[str]:
    """The leases (the default, then each kind's) not longer than the heartbeat interval; none with heartbeats off."""
    beat = settings.heartbeat_seconds
    if beat <= 0:  # heartbeats off: the sweeper goes by claimed_at and sweep_after_seconds instead
        return []
    problems = []
    if settings.lease_seconds <= beat:
        problems.append(f"SCHEDULING_LEASE_SECONDS = {settings.lease_seconds}")
    problems += [
        f"kind {name!r} lease_seconds = {kind.lease_seconds}"
        for name, kind in sorted(kinds.items())
        if kind.lease_seconds <= beat
    ]
    return problems


@checks.register()
def check_lease_outlives_heartbeat(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A lease at or below the heartbeat interval expires between two renewals: the sweeper takes back live jobs."""
    settings = conf.get()
    problems = lease_problems(settings, registry.all_kinds())
    if not problems:
        return []
    return [
        checks.Error(
            f"A lease is not longer than the heartbeat interval (SCHEDULING_HEARTBEAT_SECONDS = "
            f"{settings.heartbeat_seconds:g}): {'; '.join(problems)}. Running jobs would be swept and run again.",
            hint="Make every lease several heartbeats long (the default: 30 s against 5 s), or heartbeat more often.",
            id="scheduling.E007",
        )
    ]


def is_timekeeper_scheduler(scheduler: Any) -> bool:
    """Whether ``scheduler`` (a class or its dotted name) is Timekeeper's beat scheduler or a subclass."""
    from scheduling.fixed import beat

    try:
        found = symbol_by_name(scheduler) if isinstance(scheduler, str) else scheduler
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(found, type) and issubclass(found, beat.LeaderDatabaseScheduler)


def beat_scheduler_problem(scheduler: Any) -> str:
    """What is wrong with running beat under ``scheduler`` (empty when nothing is): W002 at beat's own start."""
    from scheduling.fixed import declarations

    if not declarations.declared() or is_timekeeper_scheduler(scheduler):
        return ""
    return (
        f"scheduling.W002: fixed-time schedules are declared, but this beat runs the scheduler {scheduler!r}: "
        f"they will not fire. Start beat with -S {TIMEKEEPER_BEAT_SCHEDULER} or set CELERY_BEAT_SCHEDULER."
    )


@checks.register()
def check_beat_scheduler(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Fixed-time schedules fire only under Timekeeper's beat scheduler (ticks, ledger, one leader).

    This sees Celery's configuration, not a ``-S`` on beat's command line: beat itself says so at its
    start (``scheduling.tasks.check_beat_scheduler_at_start``), whichever way it was chosen.
    """
    from scheduling.fixed import declarations

    if not declarations.declared():
        return []
    configured = broker.app().conf.beat_scheduler
    if is_timekeeper_scheduler(configured):
        return []
    return [
        checks.Warning(
            f"Fixed-time schedules are declared, but Celery beat's scheduler is {configured!r}: they would not fire.",
            hint=f"Set CELERY_BEAT_SCHEDULER = {TIMEKEEPER_BEAT_SCHEDULER!r} (then `celery -A <project> beat` "
            "needs no -S option). If beat is started with that -S option instead, silence this warning "
            "(SILENCED_SYSTEM_CHECKS); beat checks its own scheduler when it starts.",
            id="scheduling.W002",
        )
    ]


@checks.register()
def check_critical_kinds_quota(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """No single API caller can hold enough overdue jobs of a critical kind to fail the health check."""
    settings = conf.get()
    quota, threshold = settings.api_max_pending_jobs, settings.health_max_backlog
    if 0 < quota <= threshold:
        return []
    open_critical = sorted(name for name, kind in registry.all_kinds().items() if kind.critical and kind.api)
    if not open_critical:
        return []
    held = "no pending quota" if quota <= 0 else f"a pending quota of {quota}"
    return [
        checks.Warning(
            f"Critical kinds {', '.join(open_critical)} are open to the JSON API with {held} per owner, not "
            f"below SCHEDULING_HEALTH_MAX_BACKLOG ({threshold}): one caller's overdue jobs could fail /healthz.",
            hint="Set SCHEDULING_API_MAX_PENDING_JOBS below SCHEDULING_HEALTH_MAX_BACKLOG (and above 0).",
            id="scheduling.W005",
        )
    ]


def _pooled(connect: Any) -> bool | None:
    """``locks.appears_pooled(connect)``, or None when the database cannot be reached (other checks say so)."""
    import psycopg2

    from scheduling.core import locks

    try:
        return locks.appears_pooled(connect)
    except psycopg2.Error:
        return None


@checks.register(checks.Tags.database, deploy=False)
def check_lock_connection_not_pooled(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Advisory locks, leadership and LISTEN must hold one server session for their whole life."""
    from scheduling.core import locks

    if not databases or "default" not in databases or connections["default"].vendor != "postgresql":
        return []
    if not _pooled(locks.dedicated_connection):
        return []
    source = "SCHEDULING_DIRECT_DATABASE_URL" if conf.get().direct_database_url else "DATABASES['default']"
    return [
        checks.Warning(
            f"The lock connection ({source}) appears to go through a transaction pooler: its backend pid "
            "changes between transactions. Advisory locks, leadership and LISTEN would be taken on one "
            "server session and released, or not, on another.",
            hint="Set SCHEDULING_DIRECT_DATABASE_URL to PostgreSQL itself (or a pooler in session mode) and keep "
            "DATABASE_URL on the pooler for the ORM (docs/operations.md, 'Behind PgBouncer').",
            id="scheduling.W007",
        )
    ]


@checks.register(checks.Tags.database, deploy=False)
def check_orm_behind_transaction_pooler(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Django's named (server-side) cursors do not survive a transaction pooler's hand-over."""
    import psycopg2

    from scheduling.core import locks

    if not databases or "default" not in databases or connections["default"].vendor != "postgresql":
        return []
    if connections["default"].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return []
    if not _pooled(lambda: psycopg2.connect(**locks.default_database_parameters(), connect_timeout=5)):
        return []
    return [
        checks.Warning(
            "The default database appears to go through a transaction pooler (its backend pid changes between "
            "transactions) while server-side cursors are on: QuerySet.iterator() would fail with 'cursor does "
            "not exist', and Timekeeper prepares its batches' statements on it (the first to reach a server "
            "session that never saw them fails; the process sends text after it).",
            hint="Set DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'] = True "
            "(DATABASE_DISABLE_SERVER_SIDE_CURSORS=1 in this project).",
            id="scheduling.W008",
        )
    ]


@checks.register()
def check_cancel_on_connection_loss(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Running batches survive a broker blip only if Celery does not cancel them on the connection loss."""
    if not broker.app().conf.get("worker_cancel_long_running_tasks_on_connection_loss"):
        return []
    return [
        checks.Warning(
            "Celery cancels running late-acknowledged tasks when the broker connection is lost: every Redis "
            "restart or failover would stop the running batches (their jobs wait for the lease, non-atomic "
            "ones run again).",
            hint="Set CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False: Timekeeper's workers "
            "acknowledge what finishes after a reconnect on the new connection (scheduling.core.reconnect).",
            id="scheduling.W003",
        )
    ]


TIMEKEEPER_TASKS_BACKEND = "scheduling.backends.TimekeeperBackend"


def uses_timekeeper_tasks() -> bool:
    """Whether a TASKS entry uses Timekeeper's backend (then every process loads it: apps.ready)."""
    from django.conf import settings

    tasks_setting = getattr(settings, "TASKS", None) or {}
    return any(isinstance(p, dict) and p.get("BACKEND") == TIMEKEEPER_TASKS_BACKEND for p in tasks_setting.values())


@checks.register()
def check_tasks_backport(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Before Django 6.0, the Tasks framework's checks and log receivers load with the backport's app."""
    import django
    from django.apps import apps
    from django.conf import settings

    tasks_setting = getattr(settings, "TASKS", None) or {}
    ours = [alias for alias, params in tasks_setting.items() if params.get("BACKEND") == TIMEKEEPER_TASKS_BACKEND]
    if django.VERSION >= (6, 0) or not ours or apps.is_installed("django_tasks"):
        return []
    return [
        checks.Warning(
            f"TASKS {ours} use Timekeeper's backend on Django {django.get_version()}, but 'django_tasks' (the "
            "backport of django.tasks) is not in INSTALLED_APPS: its checks and task log lines do not run.",
            hint="Add 'django_tasks' to INSTALLED_APPS (pip install 'django-timekeeper[tasks]').",
            id="scheduling.W006",
        )
    ]


AUDIT_MIDDLEWARE = "scheduling.web.middleware.AuditMiddleware"


@checks.register()
def check_audit_middleware(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The admin's actions are recorded only when the audit middleware names the request's user."""
    from django.apps import apps
    from django.conf import settings

    middleware = list(getattr(settings, "MIDDLEWARE", []) or [])
    if not apps.is_installed("django.contrib.admin") or AUDIT_MIDDLEWARE in middleware:
        return []
    return [
        checks.Warning(
            "The admin is installed but Timekeeper's audit middleware is not in MIDDLEWARE: cancels, reschedules, "
            "pauses and token changes made in the admin would leave no audit record.",
            hint=f"Add {AUDIT_MIDDLEWARE!r} to MIDDLEWARE after Django's AuthenticationMiddleware.",
            id="scheduling.W015",
        )
    ]
