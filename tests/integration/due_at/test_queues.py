"""Named queues at the claim: each queue's room apart, an unserved queue takes nothing, batches go to their queue."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from scheduling import api
from scheduling.core import broker as core_broker
from scheduling.core import holdings
from scheduling.core import registry as core_registry
from scheduling.due_at import claim, store
from scheduling.models import ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def exports_queue(monkeypatch):
    """demo.record belongs to the named queue "exports" (as registry.handler(queue="exports") would say)."""
    kind = dataclasses.replace(core_registry.get("demo.record"), queue="exports")
    monkeypatch.setitem(core_registry._kinds, "demo.record", kind)


def _present(worker_id: str, queues: list[str]) -> None:
    """A live worker's presence in Redis, consuming ``queues`` (what the Holdings step writes)."""
    client = core_broker.client()
    client.set(
        holdings._key(holdings.PRESENCE_KEY.format(id=worker_id)), json.dumps({"pid": 1, "queues": queues}), ex=60
    )
    client.sadd(holdings._key(holdings.HOLDERS_KEY), worker_id)


def test_a_queue_without_room_never_takes_another_queues_room(exports_queue, broker):
    """50 older due jobs of a queue with no room and 5 of another: a claim takes the 5, the 50 stay pending."""
    api.schedule_many("demo.record", [{}] * 50, delay=60)
    support.make_due(ago="1 hour")
    api.schedule_many("demo.noop", [{}] * 5, delay=0)
    claims = store.claim_due_jobs(
        10,
        messages=10,
        batch_sizes={"demo.noop": 1},
        kind_queues=claim.kind_queues(),
        queue_rooms={"exports": 0, "default": 10},
    )
    assert Counter(c.kind for c in claims) == {"demo.noop": 5}
    assert ScheduledJob.objects.filter(kind="demo.record", state="pending").count() == 50


def test_each_queue_takes_its_own_room(exports_queue, broker):
    """Rooms exports 2, default 3 (batches of one): two of exports' batches and three of default's."""
    api.schedule_many("demo.record", [{}] * 10, delay=0)
    api.schedule_many("demo.noop", [{}] * 10, delay=0)
    claims = store.claim_due_jobs(
        20,
        messages=5,
        batch_sizes={"demo.noop": 1, "demo.record": 1},
        kind_queues=claim.kind_queues(),
        queue_rooms={"exports": 2, "default": 3},
    )
    assert Counter(c.kind for c in claims) == {"demo.record": 2, "demo.noop": 3}


def test_a_queue_no_live_worker_serves_has_no_room(exports_queue, broker):
    """A live worker consumes Celery's default queue only: exports' room is 0, default's the bound."""
    _present("w1:1:abc", [core_broker.default_queue()])
    rooms = claim.queue_rooms(["exports", "default"])
    assert rooms["exports"] == 0
    assert rooms["default"] > 0
    _present("w2:2:def", ["exports"])
    assert claim.queue_rooms(["exports"])["exports"] > 0


def test_a_worker_that_does_not_say_its_queues_leaves_every_queue_open(exports_queue, broker):
    """A presence without queues (an older worker mid-deploy): no queue is called unserved."""
    client = core_broker.client()
    client.set(holdings._key(holdings.PRESENCE_KEY.format(id="old:1:x")), json.dumps({"pid": 1}), ex=60)
    client.sadd(holdings._key(holdings.HOLDERS_KEY), "old:1:x")
    assert holdings.live_queues() is None
    assert claim.queue_rooms(["exports"])["exports"] > 0


def test_batches_of_a_queues_kinds_are_sent_to_its_celery_queue(exports_queue, broker):
    """claim_and_dispatch sends demo.record's batch to the Celery queue "exports" and demo.noop's to the default."""
    _present("w1:1:abc", [core_broker.default_queue(), "exports"])
    api.schedule("demo.record", {}, delay=0)
    api.schedule("demo.noop", {}, delay=0)
    report = claim.claim_and_dispatch()
    assert report.claimed == 2
    assert core_broker.queued_messages("exports") == 1
    assert core_broker.queued_messages() == 1
    assert core_broker.queued_claim_ids("scheduling.run_batch", ["exports"]) == {
        ScheduledJob.objects.get(kind="demo.record").id
    }


def test_status_reports_a_queue_with_due_work_and_no_live_worker(exports_queue, broker):
    """Due jobs in exports and a worker serving only the default queue: status names exports as unserved."""
    _present("w1:1:abc", [core_broker.default_queue()])
    api.schedule_many("demo.record", [{}] * 3, delay=0)
    numbers = api.status()
    assert numbers["queues_without_workers"] == ["exports"]
    by_name = {q["queue"]: q for q in numbers["queues"]}
    assert (by_name["exports"]["due"], by_name["exports"]["live_workers"]) == (3, 0)
    assert by_name["default"]["live_workers"] == 1


def test_the_sweeper_looks_for_run_messages_in_every_named_queue(exports_queue, broker):
    """A batch sent to the named queue "exports" is in flight for the sweeper (broker.task_queues reads it)."""
    _present("w1:1:abc", [core_broker.default_queue(), "exports"])
    api.schedule("demo.record", {}, delay=0)
    assert claim.claim_and_dispatch().claimed == 1
    assert "exports" in core_broker.task_queues("scheduling.run_batch")
    assert holdings.claim_ids_in_flight("scheduling.run_batch") == {ScheduledJob.objects.get(kind="demo.record").id}


@pytest.fixture
def routed_batches(monkeypatch):
    """CELERY_TASK_ROUTES sends scheduling.run_batch to "timekeeper.batches" (Celery's router, as a team sets it)."""
    from celery.app import routes as celery_routes

    amqp = core_broker.app().amqp
    queues = amqp.Queues(list(amqp.queues.values()))
    table = celery_routes.prepare({"scheduling.run_batch": {"queue": "timekeeper.batches"}})
    monkeypatch.setattr(amqp, "router", celery_routes.Router(table, queues, True, app=core_broker.app()))
    return "timekeeper.batches"


def test_the_default_queues_batches_go_to_the_routed_queue_and_its_room_counts_there(routed_batches, broker):
    """run_batch routed to its own queue: the default queue's batches go there; its room and the sweeper read it."""
    _present("w1:1:abc", [routed_batches])
    bound = claim.queue_rooms(["default"])["default"]
    api.schedule("demo.noop", {}, delay=0)
    assert claim.claim_and_dispatch().claimed == 1
    assert core_broker.queued_messages(routed_batches) == 1
    assert core_broker.queued_messages() == 0
    assert claim.queue_rooms(["default"])["default"] == bound - 1
    assert holdings.claim_ids_in_flight("scheduling.run_batch") == {ScheduledJob.objects.get(kind="demo.noop").id}


def _round_trips(monkeypatch) -> list[str]:
    """Record each Redis round trip of the broker client from now on (a pipeline's execute counts once)."""
    import redis

    trips: list[str] = []
    execute_command, execute = redis.Redis.execute_command, redis.client.Pipeline.execute

    def command(self, *args, **options):
        if not isinstance(self, redis.client.Pipeline):
            trips.append(str(args[0]))
        return execute_command(self, *args, **options)

    def pipeline(self, *args, **kwargs):
        trips.append("pipeline:" + ",".join(str(c[0][0]) for c in self.command_stack))
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "execute_command", command)
    monkeypatch.setattr(redis.client.Pipeline, "execute", pipeline)
    return trips


def test_the_rooms_are_read_in_one_round_trip_while_the_workers_stay_the_same(exports_queue, broker, monkeypatch):
    """Who serves what and every queue's length: one pipeline a claim; a second only when a worker came or went."""
    _present("w1:1:abc", [core_broker.default_queue(), "exports"])
    claim.queue_rooms(["exports", "default"])  # learns the holders
    trips = _round_trips(monkeypatch)
    rooms = claim.queue_rooms(["exports", "default"])
    assert rooms["exports"] > 0
    assert rooms["default"] > 0
    assert len(trips) == 1
    assert trips[0].startswith("pipeline:SMEMBERS,MGET,LLEN")
    _present("w2:2:def", ["exports"])
    trips.clear()
    claim.queue_rooms(["exports", "default"])
    assert [t.split(",")[0] for t in trips] == ["pipeline:SMEMBERS", "MGET"]
    trips.clear()
    claim.queue_rooms(["exports", "default"])
    assert len(trips) == 1


def test_a_presence_that_expired_closes_its_queue_at_the_next_claim(exports_queue, broker):
    """The holders' set unchanged, exports' only worker's presence gone: exports has no room at once."""
    _present("w1:1:abc", [core_broker.default_queue()])
    _present("w2:2:def", ["exports"])
    assert claim.queue_rooms(["exports"])["exports"] > 0
    core_broker.client().delete(holdings._key(holdings.PRESENCE_KEY.format(id="w2:2:def")))
    assert claim.queue_rooms(["exports"])["exports"] == 0


def test_the_rooms_count_the_messages_waiting_in_each_queue(exports_queue, broker):
    """Lengths read with the presences: two batches waiting in exports leave the bound minus two."""
    _present("w1:1:abc", [core_broker.default_queue(), "exports"])
    bound = claim.queue_rooms(["exports"])["exports"]
    core_broker.client().rpush(core_broker.queue_keys(["exports"])[0], "a", "b")
    rooms = claim.queue_rooms(["exports", "default"])
    assert rooms["exports"] == bound - 2
    assert rooms["default"] == bound
