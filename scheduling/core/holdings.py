"""What a dead worker held: put back within the lease, not after the broker's visibility timeout.

A Celery worker on Redis takes a message off its queue and keeps it, unacknowledged, in kombu's
``unacked`` hash (and ``unacked_index`` sorted set) until its task ends: every countdown (ETA)
message until it comes due, every late-acknowledged task while it runs. A worker whose main
process dies at once (``kill -9``, the OOM killer, a lost container) never acknowledges nor puts
back what it held, and Redis gives it out again only once older than ``visibility_timeout``
(an hour by default; celery #2481, kombu #337). A 30-second payment retry would wait an hour.

Here every worker says which messages it holds and that it is alive, in Redis beside kombu's keys
(``Holdings``, a consumer step; every key under the broker's ``global_keyprefix``):

- ``timekeeper.holder.<id>``: the worker's presence, a key that expires ``SCHEDULING_LEASE_SECONDS``
  after its last refresh; a thread of the worker's main process refreshes it every third of that.
- ``timekeeper.held.<id>``: the delivery tags the worker holds. A tag is added in the same
  transaction that records the message in ``unacked`` (kombu's ``QoS.append``) and removed in the
  one that removes it (``_remove_from_indices``: acknowledgement, rejection, restore).
- ``timekeeper.held_claims.<id>``: the tags among those of messages that carry claims
  (``scheduling.run_batch``), kept the same way, so the sweeper can tell a run message a worker
  holds (prefetched, or running) from one lost with the broker without reading every countdown.
- ``timekeeper.holders``: the ids of the workers that registered.

Every worker looks every ``SCHEDULING_SWEEP_INTERVAL_SECONDS`` for holders whose presence has
expired and puts back what they held: for each tag, one Lua script (``MOVE_SCRIPT``) removes the
message from ``unacked`` and pushes it to the front of its queue only if it is still there, as
kombu's ``restore_by_tag`` does, so two workers restoring at once put a message back once, and a
message acknowledged meanwhile is not put back. The queue is found as kombu finds it (the
exchange's bindings, the message's priority); a message whose queue cannot be found is left for
the visibility timeout rather than dropped.

**Bound**: a message a dead worker held is back in its queue at most the lease plus the sweep
interval after the death (35 s with the defaults), and a countdown runs at most that long after
its due time, plus the queue's normal lag (``docs/fault-tolerance.md``, "Workers that die").

**The sweeper** asks ``claim_ids_in_flight``: the claims carried by run messages waiting in any
queue they may be routed to (Celery's router) or held by a registered worker (``IN_FLIGHT_SCRIPT``,
one Lua script, so a message moving between a queue and ``unacked`` meanwhile is seen in one or
the other). A claim whose message is there is not taken for lost, however long a worker holds it
(``--prefetch-multiplier`` above 1, a long batch ahead of it); a dead worker's messages count too
until they are put back in their queue. Not seen: a message a worker without this step holds (an
older release during a rolling deploy), and the instant between kombu's ``BRPOP`` and its
``unacked`` write (kombu's own two steps): the sweeper takes a claim back only when its message is
missing at two sweeps in a row (``due_at.sweep``).

What it costs: one more Redis command in each delivery's and acknowledgement's transaction, a
``SET`` every lease/3 and a few reads every sweep interval per worker. What it does not change:
delivery stays at least once. A message is put back only when its holder has not refreshed its
presence for a lease: a worker frozen that long (SIGSTOP, a stalled host) may still run what was
put back (it says so in its log when it wakes), and a task running in a pool process that
outlived its killed parent runs again, as it would after the visibility timeout.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from celery import bootsteps
from kombu.transport import virtual
from kombu.utils.json import dumps as kombu_dumps

from scheduling.core import broker, conf, tasknames

logger = logging.getLogger(__name__)

HOLDERS_KEY = "timekeeper.holders"  # set: ids of the workers that registered
PRESENCE_KEY = "timekeeper.holder.{id}"  # string, expires a lease after the last refresh
HELD_KEY = "timekeeper.held.{id}"  # set: delivery tags the worker holds unacknowledged
CLAIMS_KEY = "timekeeper.held_claims.{id}"  # set: those of them whose message carries claims
CLAIM_TASKS = frozenset({tasknames.RUN_BATCH})  # tasks whose messages carry claims the sweeper must see
UNACKED_KEY_DEFAULT = "unacked"  # kombu's Redis transport (``unacked_key`` transport option)

# KEYS: unacked hash, unacked index, the dead worker's held set, then the queue lists to push to.
# ARGV: the delivery tag, the message to push (marked redelivered). Put back only if still unacked.
MOVE_SCRIPT = """
redis.call('SREM', KEYS[3], ARGV[1])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
for i = 4, #KEYS do redis.call('RPUSH', KEYS[i], ARGV[2]) end
return 1
"""
# KEYS: holders set, the dead worker's presence, held set and claims set. ARGV: its id. Forget a
# worker once its held set is empty and it has not come back.
FORGET_SCRIPT = """
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('SCARD', KEYS[3]) > 0 then return 0 end
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[4])
return 1
"""
# KEYS: the queue lists, then the unacked hash, then the holders set. ARGV: how many lists, the
# claims sets' key prefix. Returns every queued message and the unacked entry of every message a
# registered worker holds that carries claims: in one script, so nothing moving between the two
# (a delivery, a restore) is missed.
IN_FLIGHT_SCRIPT = """
local out = {}
local lists = tonumber(ARGV[1])
for i = 1, lists do
  for _, m in ipairs(redis.call('LRANGE', KEYS[i], 0, -1)) do out[#out + 1] = m end
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[lists + 2])) do
  for _, tag in ipairs(redis.call('SMEMBERS', ARGV[2] .. id)) do
    local entry = redis.call('HGET', KEYS[lists + 1], tag)
    if entry then out[#out + 1] = entry end
  end
end
return out
"""


def presence_ttl_seconds() -> float:
    """How long a worker's presence outlives its last refresh: the lease (a started claim's bound)."""
    return float(max(1, conf.get().lease_seconds))


def refresh_every_seconds() -> float:
    return max(0.5, presence_ttl_seconds() / 3)


def scan_every_seconds() -> float:
    return max(0.5, float(conf.get().sweep_interval_seconds))


def _key(name: str) -> str:
    """A key as our own client (no prefixing) must spell it: under the broker's ``global_keyprefix``."""
    return f"{broker.key_prefix()}{name}"


class Holdings(bootsteps.StartStopStep):
    """Consumer step: record what this worker holds, keep its presence, put back what dead workers held."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "timekeeper-holdings"

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.id = f"{getattr(c, 'hostname', '') or 'worker'}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.channel: Any = None  # the task channel in use (its routing table resolves queues)
        self.thread: threading.Thread | None = None
        self.restored = 0  # messages this worker put back for dead ones
        self.queues: list[str] = []  # the Celery queues this worker consumes (-Q), in its presence

    def start(self, c: Any) -> None:
        channel = c.task_consumer.channel
        if not getattr(channel, "ack_emulation", False) or not hasattr(channel.qos, "unacked_key"):
            return  # not kombu's Redis transport (app_problem refuses those elsewhere)
        track(channel.qos, self.id)
        self.channel = channel
        self.queues = sorted({str(q.name) for q in getattr(c.task_consumer, "queues", None) or []})
        try:
            self.refresh()  # present before the first delivery
        except (redis.RedisError, ValueError):  # ValueError: a broker URL redis-py cannot open
            logger.warning("cannot record this worker's presence in Redis yet", exc_info=True)
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name="timekeeper-holdings", daemon=True)
            self.thread.start()

    # The thread is not stopped at shutdown: a warm shutdown waits for running tasks, and the
    # presence must outlive them (or another worker would put a running message back). It ends
    # with the process; the presence then expires and the held set, emptied by kombu's restore at
    # shutdown, is forgotten.

    def run(self) -> None:
        next_refresh = next_scan = 0.0
        while True:
            now = time.monotonic()
            try:
                if now >= next_refresh:
                    self.refresh()
                    next_refresh = now + refresh_every_seconds()
                if now >= next_scan:
                    self.restore_dead()
                    next_scan = now + scan_every_seconds()
            except redis.RedisError:
                logger.debug("holdings: Redis did not answer; trying again", exc_info=True)
            except Exception:  # a bug here must not end the thread (and with it the presence)
                logger.exception("holdings: unexpected error")
            time.sleep(min(refresh_every_seconds(), scan_every_seconds(), 1.0))

    def refresh(self) -> None:
        """Say this worker is alive for another lease; note when it had been taken for dead."""
        client = broker.client()
        presence = _key(PRESENCE_KEY.format(id=self.id))
        pipe = client.pipeline(transaction=True)
        pipe.exists(presence)
        detail = {"pid": os.getpid(), "at": time.time(), "queues": self.queues}
        pipe.set(presence, json.dumps(detail), px=int(presence_ttl_seconds() * 1000))
        pipe.sadd(_key(HOLDERS_KEY), self.id)
        existed = pipe.execute()[0]
        if not existed and self.thread is not None:
            logger.warning(
                "this worker was silent longer than the lease: other workers may have put back what it held"
                " (those messages may run twice)",
                extra={"action": "presence_lapsed", "worker": self.id},
            )

    def restore_dead(self) -> int:
        """Put back what every worker whose presence expired held; how many messages."""
        if self.channel is None:
            return 0
        restored = restore_dead(self.channel, exclude=self.id)
        self.restored += restored
        return restored


def live_queues() -> dict[str, int] | None:
    """Each Celery queue some live worker consumes, with how many live workers consume it.

    Read from the workers' presences (a presence expires a lease after its worker's last
    refresh). None when a live worker does not say which queues it consumes (a worker of an
    older version, during a rolling deploy): then no queue can be called unserved. Raises
    ``redis.RedisError`` when Redis cannot say.
    """
    return live_queues_and_lengths([])[0]


_holders: tuple[str, ...] = ()  # the holders read last: the next read asks for their presences with the set


def live_queues_and_lengths(keys: Sequence[str]) -> tuple[dict[str, int] | None, list[int]]:
    """``live_queues``, and the length of each Redis list in ``keys`` (the claim's queue rooms).

    One round trip while the registered holders are those read last (their presences are asked for
    in the same pipeline as the set), a second one when they changed. Raises ``redis.RedisError``.
    """
    global _holders
    client = broker.client()
    guess = _holders
    pipe = client.pipeline(transaction=False)
    pipe.smembers(_key(HOLDERS_KEY))
    if guess:
        pipe.mget(_presence_keys(guess))
    for key in keys:
        pipe.llen(key)
    replies = pipe.execute()
    ids = tuple(sorted(m.decode() if isinstance(m, bytes) else str(m) for m in replies[0]))
    presences = replies[1] if guess else []
    lengths = [int(n) for n in replies[1 + bool(guess) :]]
    if ids != guess:
        _holders = ids
        presences = client.mget(_presence_keys(ids)) if ids else []
    return _queues_served(presences), lengths


def _presence_keys(ids: Sequence[str]) -> list[str]:
    return [_key(PRESENCE_KEY.format(id=i)) for i in ids]


def _queues_served(presences: Sequence[Any]) -> dict[str, int] | None:
    """``live_queues`` from the holders' presences (None for an expired one)."""
    counts: dict[str, int] = {}
    for raw in presences:
        if raw is None:
            continue
        try:
            detail = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(detail, dict) or not isinstance(detail.get("queues"), list):
            return None
        for name in detail["queues"]:
            counts[str(name)] = counts.get(str(name), 0) + 1
    return counts


def track(qos: Any, worker_id: str) -> None:
    """Make ``qos`` (kombu's Redis QoS of a channel) record each held tag in this worker's held set."""
    held = HELD_KEY.format(id=worker_id)  # kombu's client adds the prefix to SADD/SREM itself
    claims = CLAIMS_KEY.format(id=worker_id)
    if getattr(qos, "_timekeeper_held", None) == held:
        return
    remove_from_indices = qos._remove_from_indices

    def append(message: Any, delivery_tag: str) -> None:
        # kombu's QoS.append (kombu/transport/redis.py), with the tag added to the held set in the
        # same transaction: a worker killed between the two never holds a message nobody can find.
        delivery = message.delivery_info
        entry = kombu_dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with qos.pipe_or_acquire() as pipe:
            pipe.zadd(qos.unacked_index_key, {delivery_tag: time.time()}).hset(
                qos.unacked_key, delivery_tag, entry
            ).sadd(held, delivery_tag)
            if (getattr(message, "headers", None) or {}).get("task") in CLAIM_TASKS:
                pipe.sadd(claims, delivery_tag)
            pipe.execute()
            virtual.QoS.append(qos, message, delivery_tag)

    def remove(delivery_tag: str, pipe: Any = None) -> Any:
        return remove_from_indices(delivery_tag, pipe).srem(held, delivery_tag).srem(claims, delivery_tag)

    qos.append = append
    qos._remove_from_indices = remove
    qos._timekeeper_held = held


def _targets(channel: Any, entry: bytes | str) -> tuple[list[str], str] | None:
    """The queue lists (prefixed) a held message goes back to, and the message to push; None if unknown."""
    try:
        payload, exchange, routing_key = json.loads(entry)
    except (ValueError, TypeError):
        return None
    queues = channel._lookup(exchange, routing_key)  # as kombu's restore finds them (the bindings)
    if not queues:
        return None
    try:
        payload["headers"]["redelivered"] = True
        payload["properties"]["delivery_info"]["redelivered"] = True
    except (KeyError, TypeError):
        pass
    priority = channel._get_message_priority(payload, reverse=False)
    return [_key(channel._q_for_pri(queue, priority)) for queue in queues], kombu_dumps(payload)


def restore_dead(channel: Any, exclude: str = "") -> int:
    """Put back, once, every message held by a registered worker whose presence expired; how many.

    ``channel`` is a kombu Redis channel: its routing table and priority steps place each message.
    """
    client = broker.client()
    move = client.register_script(MOVE_SCRIPT)
    forget = client.register_script(FORGET_SCRIPT)
    unacked, index = _key(channel.unacked_key), _key(channel.unacked_index_key)
    total = 0
    for raw_id in client.smembers(_key(HOLDERS_KEY)):
        worker_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        presence, held = _key(PRESENCE_KEY.format(id=worker_id)), _key(HELD_KEY.format(id=worker_id))
        claims = _key(CLAIMS_KEY.format(id=worker_id))
        if worker_id == exclude or client.exists(presence):
            continue
        moved = left = 0
        for tag in client.smembers(held):
            entry = client.hget(unacked, tag)
            target = _targets(channel, entry) if entry is not None else None
            if entry is not None and target is None:
                left += 1
                logger.error(
                    "a message a dead worker held has no queue to go back to: left for the visibility timeout",
                    extra={"action": "restore_unroutable", "worker": worker_id},
                )
                client.srem(held, tag)
                client.srem(claims, tag)
                continue
            lists, message = target if target is not None else ([], "")
            moved += int(move(keys=[unacked, index, held, *lists], args=[tag, message]))
            client.srem(claims, tag)  # back in its queue (or gone): the sweeper sees it there now
        forget(keys=[_key(HOLDERS_KEY), presence, held, claims], args=[worker_id])
        if moved or left:
            logger.warning(
                "%d messages held by a worker silent for a lease (%s) put back in their queues",
                moved,
                worker_id,
                extra={"action": "restored_from_dead_worker", "worker": worker_id, "restored": moved},
            )
        total += moved
    return total


def claim_ids_in_flight(task_name: str = tasknames.RUN_BATCH) -> set[int] | None:
    """Job ids carried by ``task_name`` messages that are not lost; None if Redis cannot say.

    A message is not lost while it waits in a queue it may be routed to (``broker.task_queues``) or
    is held by a registered worker (prefetched, running, or held by a dead worker until it is put
    back). What the sweeper reads before it takes back a claim never started.
    """
    lists = broker.queue_keys(broker.task_queues(task_name))
    unacked = _key(str(broker.transport_options().get("unacked_key") or UNACKED_KEY_DEFAULT))
    try:
        client = broker.client()
        found = client.register_script(IN_FLIGHT_SCRIPT)(
            keys=[*lists, unacked, _key(HOLDERS_KEY)], args=[len(lists), _key(CLAIMS_KEY.format(id=""))]
        )
    except redis.RedisError:
        logger.warning("cannot read the job queues; claims never started are left alone", exc_info=True)
        return None
    return broker.claim_ids(task_name, found)


def install(app: Any) -> None:
    """Add the step to ``app``'s worker consumer (before the worker builds it: ``worker_init``)."""
    app.steps["consumer"].add(Holdings)
