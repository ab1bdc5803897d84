"""Django settings for Timekeeper, read from the environment (see docs/configuration.md)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import django
from csp import constants as csp
from kombu import Exchange, Queue

from project import env

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env.get_bool("DEBUG", False)
SECRET_KEY = env.get_secret_key(DEBUG)
ALLOWED_HOSTS = env.get_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env.get_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # Timekeeper's array fields and GIN index (Django 6.0 checks it: postgres.E005)
    "django_celery_beat",
    "axes",  # login throttling (django-axes): the admin's login and /accounts/login/
    "scheduling",
    "tasks",
]
if django.VERSION < (6, 0):  # Django's Tasks framework: built in from 6.0, the django-tasks backport before
    INSTALLED_APPS.insert(INSTALLED_APPS.index("scheduling"), "django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",  # Content-Security-Policy on every response (CONTENT_SECURITY_POLICY below)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "scheduling.web.middleware.RefuseNulInputMiddleware",  # NUL in a query or form: 400, not a 500
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "scheduling.web.middleware.AuditMiddleware",  # after authentication: who acts, for the audit trail
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into its 429 answer
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "project" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database: PostgreSQL only -------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or env.DEFAULT_DATABASE_URL
DATABASES = {"default": env.parse_database_url(DATABASE_URL)}
# Bounded waits: a worker must fail closed quickly when PostgreSQL is gone, not hang.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env.get_int("DATABASE_CONNECT_TIMEOUT", 5, minimum=1))
DATABASES["default"]["OPTIONS"].setdefault(
    "options", f"-c statement_timeout={env.get_int('DATABASE_STATEMENT_TIMEOUT_MS', 30_000, minimum=0)}"
)
DATABASES["default"]["CONN_MAX_AGE"] = env.get_int("DATABASE_CONN_MAX_AGE", 60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Behind a transaction pooler (PgBouncer pool_mode=transaction) a named cursor outlives the
# transaction that made it: turn server-side cursors off there (docs/operations.md, "PgBouncer").
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env.get_bool("DATABASE_DISABLE_SERVER_SIDE_CURSORS", False)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Login throttling (django-axes): after LOGIN_FAILURE_LIMIT failed logins for one username from one
# address, that pair is refused (429, even with the right password) for LOGIN_COOLOFF_MINUTES; a
# success resets the count. The address is REMOTE_ADDR (no ipware, no forwarded headers): behind a
# proxy every client has the proxy's address, and the limit then counts per username.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out pair before any password check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.get_int("LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = dt.timedelta(minutes=env.get_int("LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # failures are counted in AccessAttempt rows; successful logins are not recorded
AXES_VERBOSE = False  # no start-up banner; a failure logs the username, address and path (never a password)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
# In development WhiteNoise serves straight from the apps' static folders (no collectstatic, and
# no "No directory at STATIC_ROOT" warning, which the test suite treats as an error).
WHITENOISE_AUTOREFRESH = DEBUG
LOGIN_URL = "login"  # the demo pages' login (the admin has its own, for staff)
LOGIN_REDIRECT_URL = "tasks:trial-list"
LOGOUT_REDIRECT_URL = "login"

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "timekeeper@localhost")

# --- Production mode (DEBUG off): `manage.py check --deploy` reports nothing -----------------------
if not DEBUG:
    SECURE_SSL_REDIRECT = env.get_bool("SECURE_SSL_REDIRECT", True)
    # Trust X-Forwarded-Proto only behind a proxy that sets it (and strips clients' own): with
    # gunicorn published directly, any client could claim https. TRUST_X_FORWARDED_PROTO=1 turns it on.
    if env.get_bool("TRUST_X_FORWARDED_PROTO", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env.get_int("SECURE_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    # /healthz, /metrics and the probes (/livez, /readyz) are scraped over plain HTTP inside the network.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$", r"^livez$", r"^readyz$"]
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy (django-csp 4, one code path for Django 5.2 and 6.0), on every page in
# every mode: scripts, styles, images, fonts and connections from this site only; the few inline
# <script> and <style> blocks carry the request's nonce (request.csp_nonce), inline style=""
# attributes and event handlers are refused. No frames, no plugins, forms post here only.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [csp.SELF],
        "script-src": [csp.SELF, csp.NONCE],
        "style-src": [csp.SELF, csp.NONCE],
        "img-src": [csp.SELF, "data:"],  # the admin's icons are SVG files and data: URLs
        "font-src": [csp.SELF],
        "connect-src": [csp.SELF],  # the dashboard's refresh
        "object-src": [csp.NONE],
        "base-uri": [csp.NONE],
        "form-action": [csp.SELF],
        "frame-ancestors": [csp.NONE],
    },
}
# The debug error page and error e-mails hide passwords inside URLs too (DATABASE_URL and friends).
DEFAULT_EXCEPTION_REPORTER_FILTER = "project.error_reports.ExceptionReporterFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# --- Celery: JSON only, late acks, one message prefetched at a time ------------------------------
CELERY_BROKER_URL = env.parse_broker_url(os.environ.get("CELERY_BROKER_URL") or env.DEFAULT_BROKER_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or env.sqlalchemy_url(DATABASES["default"])
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXTENDED = True
CELERY_RESULT_EXPIRES = env.get_int("CELERY_RESULT_EXPIRES_SECONDS", 86_400)
CELERY_TASK_IGNORE_RESULT = True  # job outcomes live in scheduling's own tables; opt in per task
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep each pool process's database connection between tasks (CONN_MAX_AGE and CONN_HEALTH_CHECKS
# above still apply: Timekeeper's tasks run django.db.close_old_connections around themselves).
# Without it Celery's Django fixup closes the connection around every task: a new connection, and a
# new PostgreSQL backend, per batch (measured: about a third of the due_at engine's throughput).
CELERY_DB_REUSE_MAX = 1_000_000
# Soft shutdown: with REMAP_SIGTERM=SIGQUIT in a worker's environment, SIGTERM stops taking messages,
# gives running tasks this long to finish, then stops the rest, whose claims their pool processes
# give back at once (scheduling.due_at.runner). Keep it below the orchestrator's grace period (30 s in k8s).
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = float(env.get_int("CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT_SECONDS", 20))
CELERY_WORKER_SEND_TASK_EVENTS = True  # Flower
CELERY_TASK_SEND_SENT_EVENT = True
CELERY_TASK_TRACK_STARTED = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A broker connection lost under running late-acked tasks: let them finish (their acknowledgement
# goes out on the new connection, scheduling.core.reconnect) rather than kill them (Celery 6's
# default): killing them would throw away every running batch on each Redis blip.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Redis hides a taken message for this long before another worker may take it. Every countdown
# must end well before it (the ceiling check, scheduling.E003), or the message is delivered twice.
CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS = env.get_int("CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS", 3_600, minimum=1)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
    "visibility_timeout": CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS,
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    # How often a worker looks for messages that a dead worker took and never acknowledged (kombu
    # scans every 10 s x 10 by default); they are put back once older than the visibility timeout.
    "unacked_restore_interval": env.get_int("CELERY_BROKER_RESTORE_INTERVAL_SECONDS", 10, minimum=1),
    "unacked_restore_throttle": 1,
}
# Every Redis key Timekeeper and kombu write starts with this (lets several deployments, or test
# runs, share one Redis server without seeing each other's queues).
# Redis Sentinel (docs/operations.md, "Highly available Redis"): CELERY_BROKER_URL lists the
# sentinels (sentinel://host1:26379;sentinel://host2:26379) and this names the primary they watch.
if env.is_sentinel_url(CELERY_BROKER_URL):
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = env.broker_master_name()
CELERY_BROKER_KEYPREFIX = os.environ.get("CELERY_BROKER_KEYPREFIX", "")
if CELERY_BROKER_KEYPREFIX:
    CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = CELERY_BROKER_KEYPREFIX
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_BROKER_VISIBILITY_TIMEOUT_SECONDS}
# A worker keeps at most this many countdown (ETA) messages in memory; the rest wait in Redis.
# At the limit the worker takes NO message of any queue until one comes due, hence the deferral
# queue below and its own workers in production (docs/architecture.md, "Short deferrals"). 0 turns it off.
CELERY_WORKER_ETA_TASK_LIMIT = env.get_int("CELERY_WORKER_ETA_TASK_LIMIT", 1_000, minimum=0) or None
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
# Broker deferrals (scheduling.run_deferred and its retries) travel on their own queue. A worker
# started without -Q consumes both; `-Q timekeeper.deferred` and `-X timekeeper.deferred` split them.
CELERY_TASK_QUEUES = [
    Queue(name, Exchange(name, type="direct"), routing_key=name)
    for name in (CELERY_TASK_DEFAULT_QUEUE, "timekeeper.deferred")
]
CELERY_TASK_ROUTES = {"scheduling.run_deferred": {"queue": "timekeeper.deferred"}}
CELERY_BEAT_SCHEDULER = "scheduling.fixed.beat:LeaderDatabaseScheduler"
CELERY_BEAT_MAX_LOOP_INTERVAL = 1  # seconds: beat wakes at least this often (fixed-time ticks to the second)
CELERY_TIMEZONE = TIME_ZONE
CELERY_ENABLE_UTC = True
DJANGO_CELERY_BEAT_TZ_AWARE = True

# Django's Tasks framework (@task ... .enqueue()): durable rows of the due_at engine (docs/installing.md).
TASKS = {"default": {"BACKEND": "scheduling.backends.TimekeeperBackend", "QUEUES": ["default"]}}

# --- Flower ----------------------------------------------------------------------------------------
FLOWER_BASIC_AUTH = os.environ.get("FLOWER_BASIC_AUTH", "")  # "user:password"; required by the run command

# --- Timekeeper's own tunables (defaults in scheduling/core/conf.py) -----------------------------------
SCHEDULING_BROKER_DELAY_MAX_SECONDS = env.get_int("SCHEDULING_BROKER_DELAY_MAX_SECONDS", 900, minimum=0)
SCHEDULING_VISIBILITY_MARGIN_SECONDS = env.get_int("SCHEDULING_VISIBILITY_MARGIN_SECONDS", 300, minimum=1)
# Job handlers: tasks/jobs.py, found like every installed app's jobs.py (no SCHEDULING_HANDLER_PACKAGES needed).
# Claims: a worker heartbeats its running claims this often; the control loop's sweeper takes back
# one silent for its kind's lease (this default), checking every SWEEP_INTERVAL. A killed job runs
# again within lease + sweep interval + a claim (30 + 5 + ~1 s by default: docs/fault-tolerance.md).
SCHEDULING_HEARTBEAT_SECONDS = env.get_int("SCHEDULING_HEARTBEAT_SECONDS", 5, minimum=0)
SCHEDULING_LEASE_SECONDS = env.get_int("SCHEDULING_LEASE_SECONDS", 30, minimum=1)
SCHEDULING_SWEEP_INTERVAL_SECONDS = env.get_int("SCHEDULING_SWEEP_INTERVAL_SECONDS", 5, minimum=1)
# Finished jobs are pruned after this many days (0: at the next prune, about a minute; bench soak).
SCHEDULING_RETENTION_DAYS = env.get_int("SCHEDULING_RETENTION_DAYS", 14, minimum=0)
# /healthz and /metrics (scheduling.web.health, scheduling.web.metrics): a stale beat or a large backlog is a 503.
SCHEDULING_HEALTH_BEAT_MAX_AGE_SECONDS = env.get_int("SCHEDULING_HEALTH_BEAT_MAX_AGE_SECONDS", 30, minimum=1)
SCHEDULING_HEALTH_MAX_BACKLOG = env.get_int("SCHEDULING_HEALTH_MAX_BACKLOG", 10_000, minimum=0)
SCHEDULING_METRICS_WINDOW_SECONDS = env.get_int("SCHEDULING_METRICS_WINDOW_SECONDS", 300, minimum=10)
SCHEDULING_METRICS_TOKEN = os.environ.get("SCHEDULING_METRICS_TOKEN", "")  # set: /metrics needs "Bearer <it>"
# With DEBUG off and no token, /metrics is refused unless opened on purpose here.
SCHEDULING_METRICS_PUBLIC = env.get_bool("SCHEDULING_METRICS_PUBLIC", False)
SCHEDULING_METRICS_CACHE_SECONDS = env.get_int("SCHEDULING_METRICS_CACHE_SECONDS", 5, minimum=0)
# The JSON API's limits (docs/security.md): per-owner create rate and burst, pending quota, a job's worst case.
SCHEDULING_API_CREATE_RATE_PER_SECOND = env.get_float("SCHEDULING_API_CREATE_RATE_PER_SECOND", 10.0, minimum=0)
SCHEDULING_API_CREATE_BURST = env.get_int("SCHEDULING_API_CREATE_BURST", 50, minimum=1)
SCHEDULING_API_MAX_PENDING_JOBS = env.get_int("SCHEDULING_API_MAX_PENDING_JOBS", 1000, minimum=0)
SCHEDULING_API_MAX_JOB_SECONDS = env.get_int("SCHEDULING_API_MAX_JOB_SECONDS", 600, minimum=0)
# Fixed-time schedules set up by staff who are not superusers: ticks at least this far apart (the admin).
SCHEDULING_FIXED_MIN_INTERVAL_SECONDS = env.get_int("SCHEDULING_FIXED_MIN_INTERVAL_SECONDS", 60, minimum=1)
# OpenTelemetry spans (scheduling.core.tracing): on when asked, or when an OTLP endpoint is configured.
SCHEDULING_TRACING = env.get_bool("SCHEDULING_TRACING", bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")))

# Advisory locks, leadership and LISTEN need a session of their own: when DATABASE_URL goes through a
# transaction pooler, point this at PostgreSQL itself (empty: the default database). Liveness files
# for `manage.py timekeeper probe worker|beat` go to SCHEDULING_LIVENESS_DIR (empty: the temp dir).
SCHEDULING_DIRECT_DATABASE_URL = os.environ.get("SCHEDULING_DIRECT_DATABASE_URL", "")
SCHEDULING_LIVENESS_DIR = os.environ.get("SCHEDULING_LIVENESS_DIR", "")
SCHEDULING_LIVENESS_MAX_AGE_SECONDS = env.get_int("SCHEDULING_LIVENESS_MAX_AGE_SECONDS", 60, minimum=1)

# Claiming and sweeping need no beat entries: every worker runs the control loop (one leads).
SCHEDULING_CLAIM_INTERVAL_SECONDS = env.get_float("SCHEDULING_CLAIM_INTERVAL_SECONDS", 1.0, minimum=0.05)
