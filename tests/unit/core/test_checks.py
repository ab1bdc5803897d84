"""System checks: stable ids for PostgreSQL-only, JSON-only, the delay ceiling and the installation traps."""

from __future__ import annotations

from celery import Celery
from django.test import override_settings

from scheduling import checks
from scheduling.core import broker, conf, registry
from tests.celeryconf import override_celery


def _ids(messages):
    return [m.id for m in messages]


def test_postgresql_passes():
    """The configured database is PostgreSQL, so E001 is silent."""
    assert checks.check_database_is_postgresql() == []


def test_json_only_passes_with_project_settings():
    """The project's Celery settings accept and produce JSON only."""
    assert checks.check_json_only() == []


def test_pickle_accepted_is_an_error():
    """Accepting pickle in Celery's configuration fails scheduling.E002."""
    with override_celery(accept_content=["json", "pickle"]):
        assert _ids(checks.check_json_only()) == ["scheduling.E002"]


def test_pickle_serializer_is_an_error():
    """Producing pickle fails scheduling.E002 too."""
    with override_celery(task_serializer="pickle"):
        assert _ids(checks.check_json_only()) == ["scheduling.E002"]


@override_settings(SCHEDULING_BROKER_DELAY_MAX_SECONDS=900)
def test_ceiling_below_visibility_timeout_passes():
    """900 s plus the 300 s margin sits below a 3600 s visibility timeout."""
    with override_celery(broker_transport_options={"visibility_timeout": 3600}):
        assert checks.check_delay_ceiling() == []


@override_settings(SCHEDULING_BROKER_DELAY_MAX_SECONDS=3500)
def test_ceiling_too_close_to_visibility_timeout_fails():
    """A ceiling within the margin of Celery's visibility timeout fails scheduling.E003."""
    with override_celery(broker_transport_options={"visibility_timeout": 3600}):
        assert _ids(checks.check_delay_ceiling()) == ["scheduling.E003"]


def test_broker_details_come_from_celerys_configuration():
    """Key prefix, default queue and visibility timeout are read from Celery's app.conf, not project settings."""
    options = {"visibility_timeout": 1234, "global_keyprefix": "shop:"}
    with override_celery(broker_transport_options=options, task_default_queue="work"):
        assert (broker.key_prefix(), broker.default_queue()) == ("shop:", "work")
        assert broker.visibility_timeout_seconds() == 1234
        assert broker.queue_keys(["work"])[0] == "shop:work"


def test_project_celery_app_passes_e004():
    """The project's Celery app with a Redis broker is silent for scheduling.E004."""
    assert checks.check_celery_app() == []


def test_celerys_fallback_app_is_e004():
    """Celery's fallback app (no project celery.py) would send to amqp://localhost: a problem naming celery.py."""
    fallback = Celery("default", set_as_current=False, fixups=[])
    assert "celery.py" in (broker.app_problem(fallback) or "")


def test_app_without_broker_url_or_with_amqp_is_e004(monkeypatch):
    """A project app with no broker URL, or a non-Redis one, is a problem too."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery's own variable wins over app.conf
    no_url = Celery("shop", set_as_current=False)
    amqp = Celery("shop", set_as_current=False, broker="amqp://guest@localhost//")
    assert "has no broker URL" in (broker.app_problem(no_url) or "")
    assert "needs Redis" in (broker.app_problem(amqp) or "")


def test_a_sentinel_broker_needs_the_primarys_name_for_e004(monkeypatch):
    """A sentinel:// broker is Redis; without broker_transport_options['master_name'] it is a problem naming it."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    url = "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379"
    unnamed = Celery("shop", set_as_current=False, broker=url)
    named = Celery("shop", set_as_current=False, broker=url)
    named.conf.broker_transport_options = {"master_name": "queues"}
    assert "master_name" in (broker.app_problem(unnamed) or "")
    assert broker.app_problem(named) is None


def test_handlers_found_is_silent_for_w001():
    """The demo's tasks/jobs.py registers kinds, so W001 and E006 are silent."""
    assert checks.check_handlers() == []


@override_settings(SCHEDULING_HANDLER_PACKAGES=["no_such_package_here"])
def test_unimportable_handler_package_is_e006():
    """A SCHEDULING_HANDLER_PACKAGES entry that cannot be imported fails scheduling.E006."""
    assert _ids(checks.check_handlers()) == ["scheduling.E006"]


def test_timekeeper_beat_scheduler_passes_w002():
    """The project's beat scheduler is Timekeeper's, so W002 is silent despite the declared schedules."""
    assert checks.check_beat_scheduler() == []


def test_beat_names_a_foreign_scheduler_it_runs_under():
    """beat's own start check (a -S the system check cannot see): a foreign scheduler is named, ours passes."""
    problem = checks.beat_scheduler_problem("celery.beat:PersistentScheduler")
    assert problem.startswith("scheduling.W002:")
    assert "'celery.beat:PersistentScheduler'" in problem
    assert checks.beat_scheduler_problem(checks.TIMEKEEPER_BEAT_SCHEDULER) == ""
    assert checks.beat_scheduler_problem("no.such:Scheduler") != ""


def test_other_beat_scheduler_with_declared_schedules_is_w002():
    """Declared fixed-time schedules under Celery's default beat scheduler warn with scheduling.W002."""
    with override_celery(beat_scheduler="celery.beat:PersistentScheduler"):
        assert _ids(checks.check_beat_scheduler()) == ["scheduling.W002"]


def test_a_pending_quota_below_the_health_threshold_passes():
    """The defaults (quota 1000, threshold 10,000) keep one owner from failing /healthz: W005 is silent."""
    assert checks.check_critical_kinds_quota() == []


@override_settings(SCHEDULING_API_MAX_PENDING_JOBS=0)
def test_no_quota_with_an_open_critical_kind_warns():
    """With no quota, reminders.trial_ending (critical, open to the API) warns with scheduling.W005."""
    messages = checks.check_critical_kinds_quota()
    assert _ids(messages) == ["scheduling.W005"]
    assert "reminders.trial_ending" in messages[0].msg


@override_settings(SCHEDULING_API_MAX_PENDING_JOBS=500, SCHEDULING_HEALTH_MAX_BACKLOG=100)
def test_a_quota_over_the_health_threshold_warns():
    """A per-owner quota above the backlog threshold warns with scheduling.W005 too."""
    assert _ids(checks.check_critical_kinds_quota()) == ["scheduling.W005"]


def test_cancel_on_connection_loss_off_passes():
    """The project's settings let running tasks finish across a broker connection loss, so W003 is silent."""
    assert checks.check_cancel_on_connection_loss() == []


def test_cancel_on_connection_loss_on_is_w003():
    """Cancelling late-acked tasks on a connection loss (Celery 6's default) warns with scheduling.W003."""
    with override_celery(worker_cancel_long_running_tasks_on_connection_loss=True):
        assert _ids(checks.check_cancel_on_connection_loss()) == ["scheduling.W003"]


def _kind(name: str, lease_seconds: int) -> registry.Kind:
    return registry.Kind(
        name=name,
        func=lambda job: None,
        schema=None,
        timeout_seconds=10.0,
        max_attempts=1,
        backoff=registry.Backoff(),
        lease_seconds=lease_seconds,
        batch_size=1,
        description="",
    )


def test_registered_kinds_and_project_settings_pass_e007(monkeypatch):
    """The project's lease (30 s) and every kind of the project's apps outlive the 5 s heartbeat: E007 is silent."""
    # Kinds that other test modules register with second-long leases (they heartbeat faster) are left out.
    project_kinds = {n: k for n, k in registry.all_kinds().items() if not k.func.__module__.startswith("tests.")}
    assert "reminders.trial_ending" in project_kinds
    monkeypatch.setattr(registry, "_kinds", project_kinds)
    assert checks.check_lease_outlives_heartbeat() == []


@override_settings(SCHEDULING_LEASE_SECONDS=5, SCHEDULING_HEARTBEAT_SECONDS=5)
def test_default_lease_not_longer_than_the_heartbeat_is_e007():
    """A default lease equal to the heartbeat interval fails scheduling.E007, naming the setting."""
    (error,) = checks.check_lease_outlives_heartbeat()
    assert error.id == "scheduling.E007"
    assert "SCHEDULING_LEASE_SECONDS = 5" in error.msg


def test_a_kinds_lease_not_longer_than_the_heartbeat_is_named():
    """A kind whose own lease_seconds is at or below the heartbeat is named; longer ones and heartbeats off pass."""
    kinds = {"ok.long": _kind("ok.long", 6), "bad.short": _kind("bad.short", 5), "bad.shorter": _kind("bad.shorter", 1)}
    settings = conf.Settings(heartbeat_seconds=5.0, lease_seconds=30)
    assert checks.lease_problems(settings, kinds) == [
        "kind 'bad.short' lease_seconds = 5",
        "kind 'bad.shorter' lease_seconds = 1",
    ]
    assert checks.lease_problems(conf.Settings(heartbeat_seconds=0.0, lease_seconds=1), kinds) == []


def test_prefork_and_solo_pools_pass_e011():
    """prefork (by alias, path or class, the default) and solo keep timeouts and leases: no scheduling.E011."""
    from celery.concurrency import prefork

    for pool in ("prefork", "processes", "solo", "celery.concurrency.prefork:TaskPool", prefork.TaskPool):
        assert checks.pool_problem(pool) == "", pool
    assert checks.check_worker_pool() == []


def test_threads_gevent_eventlet_and_unknown_pools_are_e011():
    """threads, gevent, eventlet and a pool Timekeeper does not know are refused, each named with the fix."""
    for pool in ("threads", "gevent", "eventlet", "celery.concurrency.thread:TaskPool", "mypkg.pools:Custom"):
        problem = checks.pool_problem(pool)
        assert "is not supported" in problem, pool
        assert "--pool prefork" in problem
    assert "'threads'" in checks.pool_problem("celery.concurrency.thread:TaskPool")
    with override_celery(worker_pool="gevent"):
        (error,) = checks.check_worker_pool()
    assert error.id == "scheduling.E011"
    assert "'gevent'" in error.msg
