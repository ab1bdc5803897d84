"""What Timekeeper asks of the broker: send a task message by name, how full a queue is, and the
visibility timeout that bounds every countdown.

Messages are sent by task name (``tasknames``) through Celery's current app, so no mechanism
imports the module that defines the Celery tasks (``scheduling.tasks``, which sits above them).
Queue lengths are an optimisation (back-pressure): if Redis cannot answer, a queue counts as empty.

Every broker detail is read from Celery's own configuration (``current_app.conf``), however the
project fills it (Django settings under the ``CELERY_`` namespace, or ``app.conf`` in its
``celery.py``): ``broker_url``, ``broker_transport_options`` (``visibility_timeout``,
``global_keyprefix``) and ``task_default_queue``. ``app_problem()`` says when there is no such
configuration: no Celery app was loaded (Celery's fallback app would send to AMQP on localhost), or
no broker URL is set, or the broker is not Redis.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery, current_app

logger = logging.getLogger(__name__)

REDIS_VISIBILITY_TIMEOUT_DEFAULT_SECONDS = 3600  # kombu's Redis transport default
REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "socket://", "unix://")
# kombu's Redis transport keeps priorities 3, 6 and 9 in sibling lists "<queue>\x06\x16<priority>".
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)


def app() -> Celery:
    """The Celery app in force (the project's, once its ``celery.py`` is imported)."""
    return current_app._get_current_object()  # type: ignore[attr-defined] # the proxy's target


def app_problem(celery_app: Celery | None = None) -> str | None:
    """Why Timekeeper cannot use the broker of ``celery_app`` (default: the current app); None when it can.

    Celery's fallback app (what ``current_app`` is when the project never created one) has no
    configuration: it would send every message to ``amqp://guest@localhost``.
    """
    target = celery_app or app()
    if target.main == "default" and not target.set_as_current:
        return (
            "No Celery app is configured: Celery's fallback app would send messages to amqp://localhost. "
            "Create <project>/celery.py (app = Celery(...); app.config_from_object('django.conf:settings', "
            "namespace='CELERY'); app.autodiscover_tasks()) and import it in <project>/__init__.py."
        )
    url = target.conf.broker_url
    if not url:
        return (
            f"The Celery app {target.main!r} has no broker URL (it would use amqp://localhost): set CELERY_BROKER_URL."
        )
    if not str(url).startswith(REDIS_SCHEMES):
        scheme = str(url).split("://", 1)[0]
        return f"The Celery broker is {scheme}://; Timekeeper needs Redis (CELERY_BROKER_URL = 'redis://...')."
    return None


def send(task_name: str, *, args: list[Any] | None = None, **options: Any) -> Any:
    """Publish one message for ``task_name`` with Celery's options (``eta``, ``time_limit``, ``shadow``...)."""
    return current_app.send_task(task_name, args=args or [], **options)


def transport_options() -> dict[str, Any]:
    """Celery's ``broker_transport_options`` (``CELERY_BROKER_TRANSPORT_OPTIONS``)."""
    return dict(app().conf.broker_transport_options or {})


def visibility_timeout_seconds() -> float:
    """The broker's visibility timeout as Celery will use it."""
    return float(transport_options().get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT_DEFAULT_SECONDS))


def key_prefix() -> str:
    """The prefix kombu puts before every Redis key it writes (``global_keyprefix``; empty by default)."""
    return str(transport_options().get("global_keyprefix") or "")


def default_queue() -> str:
    """Celery's default queue (``task_default_queue``: "celery" unless the project says otherwise)."""
    return str(app().conf.task_default_queue)


def broker_url() -> str:
    """Celery's broker URL (``broker_url``; Celery's own ``CELERY_BROKER_URL`` variable wins)."""
    return str(app().conf.broker_url or "")


def client() -> redis.Redis:
    """A Redis client on the broker's server (the broker URL is a redis:// URL)."""
    return _client_for(broker_url())


@functools.cache
def _client_for(url: str) -> redis.Redis:
    if url.startswith(("redis+socket://", "socket://")):
        path = url.split("://", 1)[1].split("?", 1)[0]
        return redis.Redis(unix_socket_path=path, socket_timeout=2)
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def queue_keys(names: Iterable[str]) -> list[str]:
    """The Redis lists that hold the messages of the queues ``names`` (every priority step)."""
    prefix = key_prefix()
    return [
        f"{prefix}{name}" if step == 0 else f"{prefix}{name}{PRIORITY_SEPARATOR}{step}"
        for name in names
        for step in PRIORITY_STEPS
    ]


def message_args(raw: bytes | str) -> tuple[str, list[Any]] | None:
    """(task name, positional args) of a message as kombu stores it in a Redis list; None if unreadable."""
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(envelope.get("headers", {}).get("task", "")), list(args)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def queued_claim_ids(task_name: str, queue: str | Iterable[str] | None = None) -> set[int] | None:
    """Job ids carried by ``task_name`` messages waiting in ``queue`` (or in each of several); None: Redis cannot say.

    The claim keeps the job queue short (``SCHEDULING_MAX_QUEUED_BATCHES`` messages), so this reads
    a few dozen messages. A message is ``[[[id, token], ...]]``: one batch of claims.
    """
    ids: set[int] = set()
    try:
        names = [queue or default_queue()] if queue is None or isinstance(queue, str) else list(queue)
        for key in queue_keys(names):
            for raw in client().lrange(key, 0, -1):
                parsed = message_args(raw)
                if parsed is None or parsed[0] != task_name or not parsed[1]:
                    continue
                ids.update(int(pair[0]) for pair in parsed[1][0])
    except redis.RedisError:
        logger.warning("cannot read the job queue; claims never started are left alone", exc_info=True)
        return None
    return ids


def queued_messages(queue: str | None = None) -> int:
    """Messages waiting in ``queue`` (default: the default queue), not yet taken by a worker; 0 if Redis cannot say."""
    key = f"{key_prefix()}{queue or default_queue()}"
    try:
        return int(client().llen(key))
    except redis.RedisError:
        logger.warning("cannot read the queue length; claiming as if it were empty", exc_info=True)
        return 0
