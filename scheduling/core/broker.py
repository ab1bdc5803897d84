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
from urllib.parse import unquote, urlsplit

import redis
from celery import Celery, current_app

from scheduling.core import registry, tasknames

logger = logging.getLogger(__name__)

REDIS_VISIBILITY_TIMEOUT_DEFAULT_SECONDS = 3600  # kombu's Redis transport default
SENTINEL_SCHEME = "sentinel://"  # Redis Sentinel as Celery documents it: sentinel://h1:26379;sentinel://h2:26379
SENTINEL_PORT_DEFAULT = 26379
REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "socket://", "unix://", SENTINEL_SCHEME)
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
    if str(url).startswith(SENTINEL_SCHEME) and not (target.conf.broker_transport_options or {}).get("master_name"):
        return (
            "The Celery broker is Redis Sentinel (sentinel://) but names no primary: set "
            "broker_transport_options['master_name'] (CELERY_BROKER_MASTER_NAME in project/settings.py)."
        )
    return None


# A leader's sends (the control loop's batches, beat's ticks) try a lost connection once more, then
# fail: what they carry is kept in PostgreSQL and sent again, and a leader that cannot reach Redis
# must find out within seconds to hand the lead over (kombu's default, 3 retries of a connection
# that may take socket_connect_timeout each, could block a send for half a minute).
LEADER_SEND_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


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
    """A Redis client on the broker's server (with Sentinel: on the current primary, found again after a failover)."""
    return _client_for(broker_url(), str(transport_options().get("master_name") or ""))


def sentinel_client(url: str, master_name: str, timeout: float = 2.0) -> redis.Redis:
    """A client on the primary that the sentinels of ``url`` (``sentinel://h1:p1;sentinel://h2:p2``) name.

    The first URL's password and database are the primary's (as kombu reads them). Each new
    connection asks the sentinels where the primary is, so the client follows a failover.
    """
    import redis.sentinel

    addresses: list[tuple[str, int]] = []
    password: str | None = None
    username: str | None = None
    db = 0
    for index, one in enumerate(url.strip().split(";")):
        parts = urlsplit(one.strip())
        addresses.append((parts.hostname or "127.0.0.1", parts.port or SENTINEL_PORT_DEFAULT))
        if index == 0:
            password = unquote(parts.password) if parts.password else None
            username = unquote(parts.username) if parts.username else None
            db = int(parts.path.strip("/") or 0)
    limits: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    sentinel = redis.sentinel.Sentinel(addresses, sentinel_kwargs=dict(limits), **limits)
    primary: redis.Redis = sentinel.master_for(master_name, db=db, password=password, username=username, **limits)
    return primary


@functools.cache
def _client_for(url: str, master_name: str = "") -> redis.Redis:
    if url.startswith(SENTINEL_SCHEME):
        return sentinel_client(url, master_name)
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
    """(task name, positional args) of a message as kombu stores it; None if unreadable.

    ``raw`` is a message of a queue's Redis list, or an entry of kombu's ``unacked`` hash (a message
    a worker holds: ``[message, exchange, routing key]``).
    """
    try:
        envelope = json.loads(raw)
        if isinstance(envelope, list):
            envelope = envelope[0]
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(envelope.get("headers", {}).get("task", "")), list(args)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def routed_queue(task_name: str) -> str:
    """The queue Celery's router sends a ``task_name`` message to when the sender names none: the default queue
    unless ``CELERY_TASK_ROUTES`` (a router function, the task's ``queue`` option) says otherwise.

    The claim sends the batches of the kinds of the "default" named queue here (``due_at.claim.celery_queue``),
    so a run message routed to a queue of its own goes, is counted (the claim's room) and is looked for there.
    """
    try:
        routed = app().amqp.router.route({}, task_name).get("queue")
    except KeyError:  # kombu's QueueNotFound: a route to a queue that is not declared (nothing goes there)
        logger.warning("cannot route %s; using the default queue", task_name, exc_info=True)
        return default_queue()
    name = getattr(routed, "name", routed)
    return str(name) if name else default_queue()


def task_queues(task_name: str) -> list[str]:
    """The queues a ``task_name`` message may wait in: where Celery's router sends it, the default queue, and
    (for the run message) every registered kind's named queue.

    The router is Celery's own (``routed_queue``), so a run message routed to a queue of its own is
    looked for there. The default queue is always read too: messages sent before the routing changed
    wait there. The claim sends each kind's batches to its named queue's Celery queue
    (``registry.handler(queue=...)``; the "default" named queue's is the routed one), so the sweeper
    reads every one of them.
    """
    names = [default_queue()]
    routed = routed_queue(task_name)
    wanted = [routed]
    if task_name == tasknames.RUN_BATCH:
        wanted += [registry.celery_queue(kind.queue, routed) for kind in registry.all_kinds().values()]
    for name in wanted:
        if name not in names:
            names.append(name)
    return names


def claim_ids(task_name: str, messages: Iterable[bytes | str]) -> set[int]:
    """Job ids carried by the ``task_name`` messages among ``messages`` (each ``[[[id, token], ...]]``: a batch)."""
    ids: set[int] = set()
    for raw in messages:
        parsed = message_args(raw)
        if parsed is None or parsed[0] != task_name or not parsed[1]:
            continue
        ids.update(int(pair[0]) for pair in parsed[1][0])
    return ids


def queued_claim_ids(task_name: str, queue: str | Iterable[str] | None = None) -> set[int] | None:
    """Job ids carried by ``task_name`` messages still waiting in ``queue`` (or in each of several; default:
    every queue of ``task_queues``); None if Redis cannot say. Messages workers hold are not seen here: the sweeper
    asks ``holdings.claim_ids_in_flight``, which reads both at once.

    The claim keeps the job queue short (``SCHEDULING_MAX_QUEUED_BATCHES`` messages), so this reads
    a few dozen messages.
    """
    try:
        names = task_queues(task_name) if queue is None else [queue] if isinstance(queue, str) else list(queue)
        keys = queue_keys(names)
        return claim_ids(task_name, (raw for key in keys for raw in client().lrange(key, 0, -1)))
    except redis.RedisError:
        logger.warning("cannot read the job queue; claims never started are left alone", exc_info=True)
        return None


def queued_messages(queue: str | None = None) -> int:
    """Messages waiting in ``queue`` (default: the default queue; every priority step's list), not yet taken by
    a worker; 0 if Redis cannot say. One round trip."""
    try:
        pipe = client().pipeline(transaction=False)
        for key in queue_keys([queue or default_queue()]):
            pipe.llen(key)
        return sum(int(n) for n in pipe.execute())
    except redis.RedisError:
        logger.warning("cannot read the queue length; claiming as if it were empty", exc_info=True)
        return 0
