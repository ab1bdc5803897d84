"""Rate limits per kind, decided at the claim: exact under concurrent claimers, per partition, no starvation."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling import api, exceptions, registry
from scheduling.core import registry as core_registry
from scheduling.due_at import claim, control, store
from scheduling.models import KindControl, KindRate, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600.0  # a window that does not slide during a test: what is claimed is decided by the rate alone


def _claimed_kinds(claims: list[store.Claim]) -> Counter[str]:
    return Counter(c.kind for c in claims)


def test_a_rate_limited_kind_takes_its_limit_and_the_claim_fills_with_other_kinds(run_sql):
    """Rate 5 an hour, 20 due beside 10 of another kind: a claim of 100 takes 5 and the other kind's 10."""
    api.schedule_many("demo.record", [{}] * 20, delay=60)
    api.schedule_many("demo.fail", [{}] * 10, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(5, per_seconds=HOUR))
    assert _claimed_kinds(store.claim_due_jobs(100)) == {"demo.record": 5, "demo.fail": 10}
    assert _claimed_kinds(store.claim_due_jobs(100)) == {}, "the window is full: no more starts this hour"


def test_two_claimers_on_a_barrier_never_exceed_the_rate(raw_connect):
    """Two connections claiming at once, each holding its transaction open: 5 claimed in all under a rate of 5."""
    api.schedule_many("demo.record", [{}] * 30, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(5, per_seconds=HOUR))
    sql, params = store.claim_statement(), store.claim_params(20)
    conns = {"a": raw_connect(), "b": raw_connect()}
    barrier, got = threading.Barrier(2), {}

    def claim_on(name: str) -> None:
        conn = conns[name]
        barrier.wait()
        with conn.cursor() as cur:
            cur.execute(sql, params)
            got[name] = len(cur.fetchall())
        barrier.wait()  # both claims done before either commits: they overlap
        conn.commit()

    threads = [threading.Thread(target=claim_on, args=(name,)) for name in conns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sum(got.values()) == 5, got
    for conn in conns.values():  # after both committed, neither finds room
        with conn.cursor() as cur:
            cur.execute(sql, params)
            assert cur.fetchall() == []
        conn.commit()
    assert ScheduledJob.objects.filter(state="claimed").count() == 5


def test_many_rounds_of_concurrent_claims_count_every_start(raw_connect, run_sql):
    """Two claimers, ten rounds each on a barrier: 1 an hour starts 1; 240 an hour starts 2 then its bucket's 12."""
    api.schedule_many("demo.record", [{}] * 40, delay=60)
    support.make_due(state="pending")
    sql, params = store.claim_statement(), store.claim_params(2)
    conns = [raw_connect(), raw_connect()]
    barrier, total, lock = threading.Barrier(2), [0], threading.Lock()

    def rounds(conn: Any) -> None:
        for _ in range(10):
            barrier.wait()
            with conn.cursor() as cur:
                cur.execute(sql, params)
                n = len(cur.fetchall())
            conn.commit()
            with lock:
                total[0] += n

    def race() -> int:
        total[0] = 0
        threads = [threading.Thread(target=rounds, args=(conn,)) for conn in conns]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        return total[0]

    api.set_rate("demo.record", registry.Rate(1, per_seconds=HOUR))
    assert race() == 1
    run_sql("DELETE FROM scheduling_kindrate")  # a fresh window for the second race
    # 240 an hour: the first claim finds the window idle and takes its 2; then the bucket holds
    # 240 / 20 = 12 (refilled by 1 every 15 s): the other nineteen claims take those 12 and no more
    api.set_rate("demo.record", registry.Rate(240, per_seconds=HOUR))
    second = race()
    assert second in (14, 15)  # 15 only if the race took 15 s (one token refilled)
    assert ScheduledJob.objects.filter(state="claimed").count() == 1 + second


def test_a_busy_kinds_starts_are_spread_not_burst(run_sql):
    """240 an hour: an idle kind takes up to its limit at once; then at most its bucket (12) until it refills."""
    api.schedule_many("demo.record", [{}] * 300, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(240, per_seconds=HOUR))
    assert len(store.claim_due_jobs(100)) == 100  # idle for a period: the window's room (240), up to the claim's size
    assert len(store.claim_due_jobs(100)) == 12  # busy: the bucket's burst, a twentieth of the limit
    assert store.claim_due_jobs(100) == []
    run_sql("UPDATE scheduling_kindrate SET tokens_at = tokens_at - interval '1 minute'")  # 4 tokens refilled
    assert len(store.claim_due_jobs(100)) == 4


def test_the_window_slides_starts_older_than_the_period_free_room(run_sql):
    """Rate 3 an hour: a full window gives nothing; idle for two hours, the kind takes 3 again."""
    api.schedule_many("demo.record", [{}] * 10, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(3, per_seconds=HOUR))
    assert len(store.claim_due_jobs(100)) == 3
    assert store.claim_due_jobs(100) == []
    run_sql(
        "UPDATE scheduling_kindrate SET tokens_at = tokens_at - interval '121 minutes',"
        " starts_at = ARRAY(SELECT t - interval '121 minutes' FROM unnest(starts_at) t)"
    )
    assert len(store.claim_due_jobs(100)) == 3
    (window,) = KindRate.objects.filter(kind="demo.record")
    assert window.starts == [3], "the entries older than the period were dropped as the claim wrote"


def test_a_partitioned_rate_holds_for_each_value_of_the_payload_field(run_sql):
    """2 an hour per partner: partners a and b (5 each) get 2 each, c (1) gets 1, a job without the field 2."""
    payloads = [{"partner": "a"}] * 5 + [{"partner": "b"}] * 5 + [{"partner": "c"}] + [{}] * 3
    api.schedule_many("demo.record", payloads, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(2, per_seconds=HOUR, partition_by="partner"))
    claims = store.claim_due_jobs(100)
    partners = Counter(ScheduledJob.objects.get(id=c.id).payload.get("partner", "") for c in claims)
    assert partners == {"a": 2, "b": 2, "c": 1, "": 2}
    assert store.claim_due_jobs(100) == []
    assert dict(KindRate.objects.filter(kind="demo.record").values_list("partition", "starts")) == {
        "a": [2],
        "b": [2],
        "c": [1],
        "": [2],
    }


def test_a_partitioned_rate_with_a_cap_takes_the_smaller_room(run_sql):
    """2 an hour per partner and a cap of 3: three partners with room, only 3 claimed."""
    api.schedule_many("demo.record", [{"partner": p} for p in "aabbcc"], delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(2, per_seconds=HOUR, partition_by="partner"))
    api.set_max_running("demo.record", 3)
    assert len(store.claim_due_jobs(100)) == 3


def test_a_rate_limited_kind_with_a_backlog_never_starves_another_kind(run_sql):
    """A rate-limited kind with 500 due older than everything: every claim still takes the other kind's due rows."""
    api.schedule_many("demo.record", [{}] * 500, delay=60)
    support.make_due(ago="1 hour")
    api.set_rate("demo.record", registry.Rate(1, per_seconds=HOUR))
    for _ in range(3):
        api.schedule_many("demo.fail", [{}] * 4, delay=0)
        got = _claimed_kinds(store.claim_due_jobs(4))
        assert got["demo.fail"] == 4 - got["demo.record"], got
    assert ScheduledJob.objects.filter(kind="demo.record", state="claimed").count() == 1


def test_status_counts_rate_limited_due_jobs_apart_from_the_backlog(run_sql):
    """10 due of a rate-limited kind and 2 of another: rate_limited 10, backlog 2."""
    api.schedule_many("demo.record", [{}] * 10, delay=60)
    api.schedule_many("demo.fail", [{}] * 2, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", "3/h")
    numbers = api.status(include_broker=False)
    assert (numbers["rate_limited"], numbers["backlog"]) == (10, 2)


def test_a_registered_rate_is_written_to_the_control_row_and_an_operator_rate_wins():
    """The handler's rate reaches the control row; api.set_rate replaces it, None included, and a sync keeps that."""
    store.sync_code_rates({"demo.record": (10, 1.0, "partner")}, ["demo.record", "demo.fail"])
    row = KindControl.objects.get(kind="demo.record")
    assert (row.rate_limit, row.rate_period_seconds, row.rate_partition_by) == (10, 1.0, "partner")
    assert store.sync_code_rates({"demo.record": (10, 1.0, "partner")}, ["demo.record"]) == []
    api.set_rate("demo.record", None)
    store.sync_code_rates({"demo.record": (10, 1.0, "partner")}, ["demo.record"])
    row.refresh_from_db()
    assert (row.rate_limit, row.rate_set_by_operator) == (None, True)


def test_a_removed_registered_rate_is_lifted_from_the_control_row():
    """A kind registered again without its rate: the sync lifts the rate it had written."""
    store.sync_code_rates({"demo.record": (10, 1.0, "")}, ["demo.record"])
    assert store.sync_code_rates({}, ["demo.record"]) == ["demo.record"]
    assert KindControl.objects.get(kind="demo.record").rate_limit is None


def test_the_claim_writes_the_registered_rates_before_claiming(monkeypatch):
    """A kind registered with rate='2/h': claim_here syncs it and takes 2 of 5 due."""
    rated = dataclasses.replace(registry.get("demo.record"), rate=registry.Rate(2, HOUR))
    monkeypatch.setitem(core_registry._kinds, "demo.record", rated)
    api.schedule_many("demo.record", [{}] * 5, delay=0)
    assert len(claim.claim_here(100)) == 2
    claim.sync_rates(force=True)


def test_set_rate_refuses_what_is_not_a_rate():
    """'fast', 0/s and a negative period are refused with InvalidSchedule."""
    for bad in ("fast", "0/s", "10/x"):
        with pytest.raises(exceptions.InvalidSchedule):
            api.set_rate("demo.record", bad)
    with pytest.raises(exceptions.SchedulingError):
        registry.Rate(1, per_seconds=-1)


def test_rate_text_reads_back_as_given():
    """'10/s', '5/2s' and '1/m' parse to their limits and periods."""
    assert registry.Rate.parse("10/s") == registry.Rate(10, 1.0)
    assert registry.Rate.parse("5/2s") == registry.Rate(5, 2.0)
    assert registry.Rate.parse("1/m") == registry.Rate(1, 60.0)
    assert str(registry.Rate(10, 1.0, "partner")) == "10/s per partner"


def test_a_window_full_from_one_burst_does_not_burst_again_when_it_expires(run_sql):
    """240 an hour: an idle kind's burst of 100; when it expires (an hour on) the kind takes its bucket, not 100."""
    api.schedule_many("demo.record", [{}] * 300, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(240, per_seconds=HOUR))
    assert len(store.claim_due_jobs(100)) == 100
    assert len(store.claim_due_jobs(100)) == 12
    run_sql(
        "UPDATE scheduling_kindrate SET starts_at = ARRAY(SELECT t - interval '61 minutes' FROM unnest(starts_at) t),"
        " tokens_at = tokens_at - interval '61 minutes'"
    )
    assert len(store.claim_due_jobs(100)) == 12, "the bucket's burst, not the whole limit"


def _claims_an_hour_old(run_sql, starts: int, started_ago: dict[str, float]) -> None:
    """The claims' window and the bucket 61 minutes older; each partition's window of handler starts
    set to ``starts`` starts ``started_ago[partition]`` seconds before the statement."""
    run_sql(
        "UPDATE scheduling_kindrate SET starts_at = ARRAY(SELECT t - interval '61 minutes' FROM unnest(starts_at) t),"
        " tokens_at = tokens_at - interval '61 minutes',"
        " handler_starts = array_fill(statement_timestamp() - make_interval(secs => (%s::jsonb ->> partition)::float8),"
        " ARRAY[%s])",
        [json.dumps(started_ago), starts],
    )


def _handler_starts_ago(run_sql, starts: int, seconds: float) -> None:
    run_sql(
        "UPDATE scheduling_kindrate SET handler_starts = array_fill(statement_timestamp() - make_interval(secs => %s),"
        " ARRAY[%s])",
        [seconds, starts],
    )


def test_the_claim_keeps_in_step_with_the_handlers_starts_not_only_its_own_claims(run_sql):
    """10 an hour: an idle burst's claims have left the window, but its handlers started late (their batch
    waited): the claim takes nothing while those starts stay in the window for more than the loop's step
    for the kind (6 minutes, bounded to 0.5 s), and its bucket once they leave within it."""
    api.schedule_many("demo.record", [{}] * 30, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(10, per_seconds=HOUR))
    assert len(store.claim_due_jobs(100)) == 10
    _claims_an_hour_old(run_sql, 10, {"": 50 * 60})
    assert store.claim_due_jobs(100) == [], "the handlers' starts fill the window for 10 more minutes"
    _handler_starts_ago(run_sql, 10, 59 * 60)
    assert store.claim_due_jobs(100) == [], "they leave in a minute: more than the step's 0.5 s"
    _handler_starts_ago(run_sql, 10, 3599.8)
    assert len(store.claim_due_jobs(100)) == 2, "they leave within the step: the bucket's burst"
    (window,) = KindRate.objects.filter(kind="demo.record")
    assert len(window.handler_starts) == 10, "the claim reads the starts' window; the permits write it"


def test_a_partitions_claim_keeps_in_step_with_its_own_handlers_starts(run_sql):
    """2 an hour per partner, both claims an hour old: b's handlers started on time and b takes its bucket;
    a's started 10 minutes ago, and a takes nothing until they leave."""
    api.schedule_many("demo.record", [{"partner": "a"}] * 5 + [{"partner": "b"}] * 5, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(2, per_seconds=HOUR, partition_by="partner"))
    assert len(store.claim_due_jobs(100)) == 4
    _claims_an_hour_old(run_sql, 2, {"a": 10 * 60, "b": 61 * 60})
    claims = store.claim_due_jobs(100)
    assert Counter(ScheduledJob.objects.get(id=c.id).payload["partner"] for c in claims) == {"b": 2}


def test_a_limit_of_one_keeps_in_step_with_its_handlers_start_too(run_sql):
    """1 an hour, the claim an hour old: its handler started 30 minutes ago, so nothing is claimed until
    that start is within the loop's longest step (0.5 s) of leaving the window."""
    api.schedule_many("demo.record", [{}] * 3, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(1, per_seconds=HOUR))
    assert len(store.claim_due_jobs(100)) == 1
    _claims_an_hour_old(run_sql, 1, {"": 30 * 60})
    assert store.claim_due_jobs(100) == []
    _handler_starts_ago(run_sql, 1, 3599.8)
    assert len(store.claim_due_jobs(100)) == 1, "the start leaves within a step: the job waits for its permit"


def test_the_claims_look_ahead_at_the_starts_is_the_control_loops_step():
    """The claim looks as far ahead at the handlers' starts as the loop's step for the kind, within its bounds."""
    assert (store.START_LEAD_MIN_SECONDS, store.START_LEAD_MAX_SECONDS) == (
        control.RATE_STEP_SECONDS,
        control.WAIT_STEP_SECONDS,
    )


def test_the_control_loop_claims_again_once_per_start_of_the_fastest_waiting_rate():
    """The loop's step: a start's worth of window (period / limit) of the fastest rate-limited kind with due jobs."""
    assert store.rate_limited_due() is None, "no rate-limited kind has due jobs"
    api.schedule_many("demo.record", [{"label": "a"}] * 3, delay=60)
    api.schedule_many("demo.fail", [{}] * 3, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(5, per_seconds=1, partition_by="label"))
    assert store.rate_limited_due() == pytest.approx(0.2)
    api.set_rate("demo.fail", "50/s")
    assert store.rate_limited_due() == pytest.approx(0.02)
    api.pause("demo.fail")
    assert store.rate_limited_due() == pytest.approx(0.2), "a paused kind is not waiting on its window"


def test_a_claim_without_rates_leaves_the_rate_limited_kinds_out_and_their_windows_untouched(run_sql):
    """``rates=False`` (the control loop's turns between a rate's steps): capped and uncontrolled kinds are
    claimed as always; a rate-limited kind, capped or not, takes nothing and its window is not written."""
    api.schedule_many("demo.record", [{}] * 5, delay=60)  # rate-limited
    api.schedule_many("demo.choose", [{}] * 5, delay=60)  # rate-limited and capped
    api.schedule_many("demo.fail", [{}] * 5, delay=60)  # capped
    api.schedule_many("demo.noop", [{}] * 3, delay=60)  # neither
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(5, per_seconds=HOUR))
    api.set_rate("demo.choose", registry.Rate(5, per_seconds=HOUR))
    api.set_max_running("demo.choose", 2)
    api.set_max_running("demo.fail", 2)
    assert _claimed_kinds(store.claim_due_jobs(100, rates=False)) == {"demo.fail": 2, "demo.noop": 3}
    assert not KindRate.objects.exists(), "no rate window read or written"
    assert _claimed_kinds(store.claim_due_jobs(100)) == {"demo.record": 5, "demo.choose": 2}
    assert set(KindRate.objects.values_list("kind", flat=True)) == {"demo.record", "demo.choose"}


def test_a_claim_that_holds_no_control_row_takes_nothing_of_a_capped_or_rate_limited_kind(raw_connect):
    """Another transaction holds both control rows: the claim is the one without their branches and takes the
    other kind only; once they are free, the full claim takes the cap's and the rate's room."""
    api.schedule_many("demo.record", [{}] * 5, delay=60)
    api.schedule_many("demo.fail", [{}] * 5, delay=60)
    api.schedule_many("demo.noop", [{}] * 3, delay=60)
    support.make_due(state="pending")
    api.set_rate("demo.record", registry.Rate(2, per_seconds=HOUR))
    api.set_max_running("demo.fail", 3)
    holder = raw_connect()
    with holder.cursor() as cur:  # as a second claimer or an operator's open transaction would
        cur.execute("SELECT kind FROM scheduling_kindcontrol WHERE kind IN ('demo.record', 'demo.fail') FOR UPDATE")
    with CaptureQueriesContext(connection) as captured:
        assert _claimed_kinds(store.claim_due_jobs(100)) == {"demo.noop": 3}
    assert not [q for q in captured.captured_queries if "INSERT INTO scheduling_kindrate" in q["sql"]]
    holder.rollback()
    assert _claimed_kinds(store.claim_due_jobs(100)) == {"demo.record": 2, "demo.fail": 3}
