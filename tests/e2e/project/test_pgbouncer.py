"""Behind a real PgBouncer in transaction mode: the ORM pooled, advisory locks, leadership and LISTEN direct.

The workers and beats reach the test database through Debian's PgBouncer (``pool_mode =
transaction``, the hosted-PostgreSQL default) for everything the ORM does, and directly through
``SCHEDULING_DIRECT_DATABASE_URL`` for their lock sessions. The due_at engine and a fixed-time
leader handover run with no duplicate run, one control leader at a time, and the pooler's own
statistics show that the work really went through it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings

from scheduling import api
from scheduling import checks as scheduling_checks
from scheduling.core import locks
from scheduling.models import JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests import support
from tests.e2e import fixed_soak, harness, private_services
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]

JOBS = 300


@pytest.fixture
def bouncer(transactional_db: None) -> Iterator[private_services.PgBouncer]:
    """A PgBouncer in transaction mode in front of the test database, on a free port."""
    s = connection.settings_dict
    base = private_services._scratch_dir("tk-pgbouncer-")
    host, port, user = s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432), s["USER"] or "postgres"
    pooler = private_services.PgBouncer(base, host=host, port=port, database=s["NAME"], user=user)
    try:
        pooler.start()
        yield pooler
    finally:
        pooler.stop()
        if pooler.log_path.exists():
            (harness.ARTIFACTS / "e2e").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pooler.log_path, harness.ARTIFACTS / "e2e" / "pgbouncer.log")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pooled_cluster(cluster: harness.Cluster, bouncer: private_services.PgBouncer) -> harness.Cluster:
    """The e2e cluster with the ORM through the pooler and the lock sessions direct."""
    cluster.env = {
        "DATABASE_URL": bouncer.url(),
        "SCHEDULING_DIRECT_DATABASE_URL": harness.database_url(),
        "DATABASE_DISABLE_SERVER_SIDE_CURSORS": "1",
    }
    return cluster


def _connect(url: str) -> Callable[[], Any]:
    """A psycopg2 connection factory for locks.appears_pooled."""

    def connect() -> Any:
        conn = psycopg2.connect(url, connect_timeout=5)
        conn.autocommit = True
        return conn

    return connect


def _w007(direct_url: str) -> list[checks.CheckMessage]:
    with override_settings(SCHEDULING_DIRECT_DATABASE_URL=direct_url):
        return scheduling_checks.check_lock_connection_not_pooled(databases=["default"])


def test_the_lock_connection_check_tells_the_transaction_pooler_from_postgresql(bouncer):
    """appears_pooled is True through PgBouncer (transaction mode), False on PostgreSQL; W007 warns only then."""
    assert locks.appears_pooled(_connect(bouncer.url())) is True
    assert locks.appears_pooled(_connect(harness.database_url())) is False
    assert [m.id for m in _w007(bouncer.url())] == ["scheduling.W007"]
    assert _w007(harness.database_url()) == []
    assert _w007("") == [], "the default (the test database itself) is direct"


def test_due_at_engine_through_pgbouncer_runs_every_job_once_with_one_control_leader(pooled_cluster, bouncer):
    """300 jobs through a transaction pooler, two workers and a beat: each runs once, one control loop leads."""
    before = bouncer.stats().get("total_xact_count", 0)
    workers = [pooled_cluster.worker("w1", concurrency=2), pooled_cluster.worker("w2", concurrency=2)]
    pooled_cluster.beat()
    for worker in workers:
        wait_ready(worker)
    wait_for(lambda: any("control loop leads here" in w.log() for w in workers), 30, message="a control leader")
    ids = api.schedule_many("demo.record", [{"label": f"pooled-{i}"} for i in range(JOBS)], delay=1)
    wait_for(
        lambda: ScheduledJob.objects.filter(pk__in=ids, state=JobState.DONE).count() == JOBS,
        120,
        0.5,
        message="every job to run",
    )
    keys = [f"job:{i}" for i in ids]
    assert Execution.objects.filter(idempotency_key__in=keys).count() == JOBS, "0 duplicate runs"
    assert JobAttempt.objects.filter(job_id__in=ids).count() == JOBS
    leaders = [w.name for w in workers if "control loop leads here" in w.log()]
    assert len(leaders) == 1, f"one control loop led (its lock was a real session): {leaders}"
    assert bouncer.stats()["total_xact_count"] > before, "the workers' transactions went through the pooler"
    assert bouncer.clients() >= 4, "each worker's pool processes hold a client connection to the pooler"


@pytest.mark.slow
def test_fixed_time_leader_handover_through_pgbouncer_runs_each_tick_once(pooled_cluster, bouncer):
    """Every 2 s, two beats, the leader kill -9ed once, through the pooler: each tick runs exactly once."""
    before = bouncer.stats().get("total_xact_count", 0)
    report = fixed_soak.soak(pooled_cluster, seconds=24, every=2, workers=2, kill_leader_after=8, kills=1)
    print(f"\nfixed-time through pgbouncer: {report.summary()}")
    assert report.problems == []
    assert len(report.handovers) == 1, "the standby beat took the lead"
    assert report.ticks_checked >= 8
    assert report.duplicates_refused >= report.injected >= 3
    assert bouncer.stats()["total_xact_count"] > before


def _check(env: dict[str, str]) -> str:
    done = support.manage("check", "--database", "default", env=harness.base_env(env), timeout=120)
    return done.stdout + done.stderr


def test_manage_check_warns_w007_and_w008_behind_the_pooler_until_configured(bouncer):
    """`check --database default` all on the pooler: W007 and W008; direct lock URL and cursors off: neither."""
    pooled = _check({"DATABASE_URL": bouncer.url()})
    assert "scheduling.W007" in pooled
    assert "scheduling.W008" in pooled
    configured = _check(
        {
            "DATABASE_URL": bouncer.url(),
            "SCHEDULING_DIRECT_DATABASE_URL": harness.database_url(),
            "DATABASE_DISABLE_SERVER_SIDE_CURSORS": "1",
        }
    )
    assert "scheduling.W007" not in configured
    assert "scheduling.W008" not in configured
    assert "System check identified no issues" in configured
