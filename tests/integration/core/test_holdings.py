"""What a dead worker held, on real Redis through kombu's own transport: put back once, a live one's left alone."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
from django.conf import settings

from scheduling.core import broker, holdings, tasknames


@pytest.fixture
def channels() -> Iterator[list[Any]]:
    """Three kombu channels on the test Redis (one holder, two restorers), with the broker's key prefix."""
    connections = [
        kombu.Connection(settings.CELERY_BROKER_URL, transport_options=broker.transport_options()) for _ in range(3)
    ]
    yield [c.channel() for c in connections]
    for connection in connections:
        connection.release()


def take(channel: Any, queue: str, count: int) -> list[Any]:
    """Publish ``count`` messages to ``queue`` and take them unacknowledged, as a worker holds countdowns."""
    exchange = kombu.Exchange(queue, type="direct")
    kombu.Queue(queue, exchange, routing_key=queue)(channel).declare()
    producer = kombu.Producer(channel, exchange=exchange, routing_key=queue)
    for i in range(count):
        producer.publish({"i": i})
    return [channel.basic_get(queue, no_ack=False) for _ in range(count)]


def register(worker_id: str, *, alive: bool) -> None:
    """Put ``worker_id`` among the holders, with a fresh presence or with none (dead)."""
    client = broker.client()
    client.sadd(holdings._key(holdings.HOLDERS_KEY), worker_id)
    if alive:
        client.set(holdings._key(holdings.PRESENCE_KEY.format(id=worker_id)), "{}", px=60_000)


def test_a_dead_holders_messages_go_back_once_though_two_workers_restore_at_once(channels):
    """Two restorers at once put each unacknowledged message of a dead holder back once; an acked one stays gone."""
    holder, first, second = channels
    worker_id, queue = f"dead-{uuid.uuid4().hex[:6]}", f"q-{uuid.uuid4().hex[:6]}"
    holdings.track(holder.qos, worker_id)
    register(worker_id, alive=False)
    messages = take(holder, queue, 5)
    client = broker.client()
    held_key = holdings._key(holdings.HELD_KEY.format(id=worker_id))
    assert client.scard(held_key) == 5, "each tag was recorded with kombu's unacked entry"
    holder.basic_ack(messages[0].delivery_tag)
    assert client.scard(held_key) == 4, "an acknowledgement removes the tag"

    barrier, restored = threading.Barrier(2), []

    def restore(channel: Any) -> None:
        barrier.wait()
        restored.append(holdings.restore_dead(channel))

    threads = [threading.Thread(target=restore, args=(c,)) for c in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sum(restored) == 4, restored
    assert client.llen(holdings._key(queue)) == 4, "each held message is back in its queue once"
    tags = [m.delivery_tag for m in messages]
    assert client.hmget(holdings._key("unacked"), tags) == [None] * 5, "nothing is left unacknowledged"
    assert not client.exists(held_key)
    assert not client.sismember(holdings._key(holdings.HOLDERS_KEY), worker_id), "the dead holder is forgotten"
    again = [first.basic_get(queue, no_ack=True) for _ in range(4)]
    assert sorted(m.payload["i"] for m in again) == [1, 2, 3, 4]
    assert all(m.delivery_info["redelivered"] for m in again), "marked redelivered, as kombu's restore does"


def test_a_live_holders_messages_are_left_alone(channels):
    """A holder whose presence is fresh keeps what it holds: nothing is put back."""
    holder, restorer, _ = channels
    worker_id, queue = f"live-{uuid.uuid4().hex[:6]}", f"q-{uuid.uuid4().hex[:6]}"
    holdings.track(holder.qos, worker_id)
    register(worker_id, alive=True)
    messages = take(holder, queue, 3)

    assert holdings.restore_dead(restorer) == 0
    client = broker.client()
    assert client.llen(holdings._key(queue)) == 0
    assert all(client.hexists(holdings._key("unacked"), m.delivery_tag) for m in messages)
    for message in messages:
        holder.basic_ack(message.delivery_tag)
    assert client.scard(holdings._key(holdings.HELD_KEY.format(id=worker_id))) == 0


def publish_run_messages(channel: Any, queue: str, job_ids: list[int]) -> None:
    """Publish one ``scheduling.run_batch`` message per job to ``queue``, as Celery's protocol 2 writes it."""
    exchange = kombu.Exchange(queue, type="direct")
    kombu.Queue(queue, exchange, routing_key=queue)(channel).declare()
    producer = kombu.Producer(channel, exchange=exchange, routing_key=queue, serializer="json")
    for job_id in job_ids:
        body = [[[[job_id, str(uuid.uuid4())]]], {}, {}]
        producer.publish(body, headers={"task": tasknames.RUN_BATCH, "id": str(uuid.uuid4())})


def test_run_messages_queued_or_held_by_a_registered_worker_are_in_flight(channels):
    """The sweeper's view: claims of run messages waiting in the queue or held unacknowledged; an acked one is gone."""
    holder = channels[0]
    worker_id, queue = f"live-{uuid.uuid4().hex[:6]}", broker.default_queue()
    holdings.track(holder.qos, worker_id)
    register(worker_id, alive=True)
    take(holder, queue, 1)  # another task's message: held, but carries no claims
    publish_run_messages(holder, queue, [11, 12, 13])
    held = [holder.basic_get(queue, no_ack=False) for _ in range(2)]
    assert [m.payload[0][0][0][0] for m in held] == [11, 12]
    claims_key = holdings._key(holdings.CLAIMS_KEY.format(id=worker_id))
    assert broker.client().scard(claims_key) == 2, "only the run messages are recorded as carrying claims"
    assert holdings.claim_ids_in_flight() == {11, 12, 13}, "two held by the worker, one still queued"
    holder.basic_ack(held[0].delivery_tag)
    assert holdings.claim_ids_in_flight() == {12, 13}, "an acknowledged run message is over"
    assert broker.client().scard(claims_key) == 1
