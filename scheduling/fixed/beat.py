"""Celery Beat with django-celery-beat's database scheduler, one leader among replicas.

Any number of ``celery -A project beat`` processes may run. Each tick, a process that does not
lead tries ``pg_try_advisory_lock`` on a dedicated connection (``locks``); the one holding it
leads and sends messages, the others send nothing and retry every ``STANDBY_RETRY_SECONDS``. The
lock dies with the leader's connection, so a standby takes over within seconds of a crash. The
leader records a heartbeat row that health checks and the admin read.

Leadership only avoids duplicate sends in the normal case; exactly-once per tick is the run
ledger's job (``fixed``), which also covers a handover in the middle of a tick.

Fixed-time schedules (periodic tasks with a ``SchedulePolicy``) are ``FixedEntry`` entries: their
due-ness is not Celery's crontab arithmetic from ``last_run_at`` but ``ticks.plan()`` on the
schedule's row (anchor, last tick, policy) with the DST-correct ``scheduling.fixed.cron``, at the
*database* clock as this process sees it (``DatabaseClock``: local time plus an offset measured
every ``SCHEDULING_FIXED_CLOCK_SYNC_SECONDS``). The message carries the tick's scheduled instant,
a value of the schedule, so two beats compute the same tick for the same moment. Beat's progress
is ``SchedulePolicy.last_tick`` in the database, so a new leader carries on where the old one
stopped: a tick the old leader sent but did not record is sent again and refused by the ledger.

A leader whose sends the broker refused ``BROKER_FAILURES_TO_STEP_DOWN`` ticks in a row (Redis
unreachable from this host, PostgreSQL not) steps down and stands by for ``STEP_DOWN_HOLD_SECONDS``,
so a beat on a host that can reach the broker takes over. Its lock session is bounded like every
dedicated session (``locks``), so the lead of a beat whose host vanished is free within
``locks.VANISHED_CLIENT_BOUND_SECONDS``; one that comes back checks its session before it sends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from typing import Any, Protocol

import kombu.exceptions
from celery.schedules import schedstate
from django.db import DatabaseError, close_old_connections
from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry

from scheduling.core import broker, conf, exceptions, leadership, liveness, locks, tasknames
from scheduling.core import store as core_store
from scheduling.fixed import messages, policies, store, ticks
from scheduling.models import MissedPolicy, SchedulePolicy

logger = logging.getLogger(__name__)

LEADER_ROLE = "beat"  # one beat in the cluster sends (core.leadership)
HEARTBEAT_ROLE = "beat"  # the heartbeat row beat's leader writes (health, metrics and the dashboard read it)
STANDBY_RETRY_SECONDS = 1.0  # how often a standby tries to take the lead
LEADER_CHECK_SECONDS = 2.0  # how often the leader checks its lock connection is alive
HEARTBEAT_SECONDS = 5.0  # how often the leader writes its heartbeat row
SEND_RETRY_SECONDS = 2.0  # after a failed send of a fixed-time tick, look again this soon
BROKER_FAILURES_TO_STEP_DOWN = 2  # ticks in a row whose sends the broker refused: the leader steps down
STEP_DOWN_HOLD_SECONDS = 3.0  # a stepped-down beat lets a standby (retrying every 1 s) take the lead first
MISSED_ERROR = "beat was not running in time for this tick (missed_policy={policy})"
MISSED_LOG = "ticks missed while beat was not running"


class Clock(Protocol):
    """Where beat reads the time for fixed-time due-ness (injected in tests)."""

    def now(self) -> dt.datetime: ...


class DatabaseClock:
    """The database clock as seen from this process: read now and then, advanced by the monotonic clock.

    Only the database clock says what is due; asking PostgreSQL on every beat loop would cost a
    query per second, so it is read every ``SCHEDULING_FIXED_CLOCK_SYNC_SECONDS`` (half the round
    trip is the error) and ``time.monotonic()`` measures the time since. Not the host's wall clock:
    a step of it (an NTP step, a VM resumed) between two reads moved beat's "database" time with it,
    and beat recorded ticks of the next ten minutes as missed and sent one of them early.
    """

    def __init__(self) -> None:
        self._database_at: float | None = None  # the database clock (epoch seconds) at the last read
        self._monotonic_at = 0.0  # time.monotonic() when it was read (the round trip's middle)
        self._offset_seconds: float | None = None  # database minus host wall clock then (for the log only)

    def now(self) -> dt.datetime:
        mono = time.monotonic()
        every = conf.get().fixed_clock_sync_seconds
        if self._database_at is None or mono - self._monotonic_at >= every:
            self._sync()
            mono = time.monotonic()
        if self._database_at is None:  # never read (the database is down since beat started): the host's
            return dt.datetime.now(dt.UTC)
        return dt.datetime.fromtimestamp(self._database_at + (mono - self._monotonic_at), dt.UTC)

    def _sync(self) -> None:
        try:
            before = time.monotonic()
            database_now = core_store.database_now()
            after = time.monotonic()
        except DatabaseError:
            logger.warning("cannot read the database clock; counting on from the last reading", exc_info=True)
            return
        self._database_at = database_now.timestamp()
        self._monotonic_at = (before + after) / 2
        offset = self._database_at - time.time() + (after - self._monotonic_at)
        if self._offset_seconds is None or abs(offset - self._offset_seconds) > 1.0:
            logger.info(
                "beat clock offset to the database measured",
                extra={"offset_seconds": round(offset, 3), "action": "clock_sync"},
            )
        self._offset_seconds = offset


_default_clock: DatabaseClock | None = None


def default_clock() -> DatabaseClock:
    """The process's database clock, created on first use."""
    global _default_clock
    if _default_clock is None:
        _default_clock = DatabaseClock()
    return _default_clock


class FixedEntry(ModelEntry):
    """A fixed-time schedule's beat entry: due-ness from ``ticks.plan()`` on the schedule's row.

    ``is_due()`` re-reads the row (anchor, last tick, policy, timing) each time beat asks, so
    suspension and policy edits apply at once, and keeps the plan for ``apply_entry`` to carry out.
    The delay it returns is until the schedule's next tick, capped at
    ``SCHEDULING_FIXED_RECHECK_SECONDS``.
    """

    def __init__(self, model: Any, app: Any = None, clock: Clock | None = None) -> None:
        super().__init__(model, app=app)
        self.clock: Clock = clock or default_clock()
        self.policy_id: int = model.policy.pk
        self.plan: ticks.TickPlan | None = None

    def __next__(self) -> FixedEntry:
        entry = super().__next__()
        assert isinstance(entry, FixedEntry)
        entry.clock = self.clock
        return entry

    def is_due(self) -> schedstate:
        recheck = conf.get().fixed_recheck_seconds
        self.plan = None
        if not self.model.enabled:
            return schedstate(False, recheck)
        now = self.clock.now()
        policy = (
            SchedulePolicy.objects.select_related("periodic_task", "periodic_task__crontab", "periodic_task__interval")
            .filter(pk=self.policy_id)
            .first()
        )
        if policy is None:
            return schedstate(False, recheck)
        try:
            if policies.timing_key(policy.periodic_task, policy) != policy.timing_key:
                # An edit that bypassed the save signals (a QuerySet.update()): count from now on.
                policies.note_timing_change(policy, at=now)
            state = policies.tick_state(policy)
        except exceptions.SchedulingError as exc:
            logger.error(
                "fixed-time schedule is invalid; not firing it",
                extra={"schedule": self.name, "error": str(exc), "action": "invalid_schedule"},
            )
            return schedstate(False, recheck)
        plan = ticks.plan(
            state,
            now,
            late_seconds=conf.get().fixed_late_seconds,
            max_ticks=conf.get().fixed_max_catch_up,
        )
        self.plan = plan
        return schedstate(plan.due, ticks.seconds_until(plan.next_tick, now, recheck))


_building = threading.local()  # .now: a LeaderDatabaseScheduler is being built on this thread


class LeaderDatabaseScheduler(DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler that only sends while it holds the leader lock."""

    def __init__(self, *args: Any, clock: Clock | None = None, **kwargs: Any) -> None:
        # Celery's stop handler (SIGINT, SIGTERM: celery.apps.beat's _sync) asks the service for its
        # scheduler, to save it, then exits. A stop that lands while the first one is still being built
        # (its first read of the schedule) would build a second on the same Django connection in the
        # middle of the first's query, and django-celery-beat logged a traceback ("connection already
        # closed", seen on a Ctrl-C of dev.py run while beat started). That second build exits at once
        # instead: nothing was read yet, so nothing needs saving.
        if getattr(_building, "now", False):
            raise SystemExit(0)
        _building.now = True
        try:
            self._build(*args, clock=clock, **kwargs)
        finally:
            _building.now = False

    def _build(self, *args: Any, clock: Clock | None = None, **kwargs: Any) -> None:
        self._leadership = leadership.Leadership(LEADER_ROLE, check_seconds=LEADER_CHECK_SECONDS)
        self._last_heartbeat = 0.0
        self._lead_recorded = False  # whether this leadership's first heartbeat is written
        self._send_failed = False
        self._broker_failed = False  # this tick's failed send was the broker's
        self._broker_failures = 0  # ticks in a row whose sends the broker refused
        self._hold_until = 0.0  # after a step-down: no try for the lead before this (monotonic)
        self.step_downs = 0
        self._alive = liveness.Throttled("beat")
        self.clock: Clock = clock or default_clock()
        super().__init__(*args, **kwargs)

    @property
    def is_leader(self) -> bool:
        return self._leadership.leading

    def _ensure_leader(self) -> bool:
        was_leading = self._leadership.leading
        if not was_leading and time.monotonic() < self._hold_until:
            return False
        if not self._leadership.lead():
            return False
        if not was_leading:
            self._last_heartbeat = 0.0
            self._lead_recorded = False
            logger.info("this beat leads now", extra={"holder": leadership.process_name(), "action": "leader_acquired"})
            # Re-read the schedule: the previous leader may have advanced it.
            self._initial_read = True
            self._heap = None
        return True

    def _write_heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_SECONDS:
            return
        self._last_heartbeat = now
        try:
            close_old_connections()
            # A new leadership starts its "leading since" now, even if the row existed.
            core_store.record_heartbeat(HEARTBEAT_ROLE, leadership.process_name(), new_lead=not self._lead_recorded)
            self._lead_recorded = True
        except DatabaseError:
            logger.warning("could not record the beat heartbeat", exc_info=True)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self._alive(leading=self._leadership.leading)  # leader or standby: this loop turns (the pod's liveness)
        if not self._ensure_leader():
            return STANDBY_RETRY_SECONDS
        with contextlib.suppress(DatabaseError):
            locks.bound_django_session()  # a beat that vanishes mid-transaction leaves no lock for long
        self._write_heartbeat()
        try:
            delay = min(super().tick(*args, **kwargs), LEADER_CHECK_SECONDS)
        except kombu.exceptions.OperationalError:  # no producer: the broker cannot be reached at all
            logger.warning("cannot reach the broker to send ticks", exc_info=True, extra={"action": "send_failed"})
            self._send_failed = self._broker_failed = True
            self._heap = None
            delay = SEND_RETRY_SECONDS
        if self._send_failed:
            self._send_failed = False
            if self._count_broker_failure():
                return STANDBY_RETRY_SECONDS
            return SEND_RETRY_SECONDS
        return delay

    def _count_broker_failure(self) -> bool:
        """After a tick whose send failed: step down (True) once the broker refused enough ticks in a row."""
        broker_failed, self._broker_failed = self._broker_failed, False
        if not broker_failed:
            return False
        self._broker_failures += 1
        if self._broker_failures < BROKER_FAILURES_TO_STEP_DOWN:
            return False
        self._broker_failures = 0
        self.step_downs += 1
        self._hold_until = time.monotonic() + STEP_DOWN_HOLD_SECONDS
        self._leadership.resign()
        logger.error(
            "beat stepped down: the broker cannot be reached from this process; another beat may lead",
            extra={
                "role": LEADER_ROLE,
                "failed_ticks": BROKER_FAILURES_TO_STEP_DOWN,
                "hold_seconds": STEP_DOWN_HOLD_SECONDS,
                "action": "stepped_down",
            },
        )
        return True

    # --- fixed-time schedules ----------------------------------------------------------------------

    def enabled_models_qs(self) -> Any:
        """django-celery-beat's set, plus every enabled fixed-time schedule.

        django-celery-beat leaves out crontabs whose hour is not near the current one (an
        optimisation that assumes fixed zone offsets); fixed-time schedules decide their own
        due-ness and must always be present to record missed ticks and to follow edits.
        """
        fixed_time = self.Model.objects.enabled().filter(policy__isnull=False)
        return (super().enabled_models_qs() | fixed_time).select_related("policy", "crontab", "interval")

    def all_as_schedule(self) -> dict[str, Any]:
        entries: dict[str, Any] = {}
        for model in self.enabled_models():
            try:
                if _has_policy(model):
                    entries[model.name] = FixedEntry(model, app=self.app, clock=self.clock)
                else:
                    entries[model.name] = self.Entry(model, app=self.app)
            except ValueError as exc:  # Celery cannot read the row (django-celery-beat drops it silently)
                logger.error(
                    "periodic task's schedule cannot be read by Celery; not firing it",
                    extra={"schedule": model.name, "error": str(exc), "action": "invalid_schedule"},
                )
        return entries

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if not isinstance(entry, FixedEntry):
            super().apply_entry(entry, producer=producer)
            return
        plan, entry.plan = entry.plan, None
        if plan is None or not plan.due:
            return
        try:
            carry_out(self.app, entry.policy_id, entry.name, plan, producer=producer, options=entry.options)
            self._broker_failures = 0  # a tick went out (or had nothing to send): the broker is reachable
        except Exception as exc:  # a broker or database error: nothing advanced, the tick is sent again soon
            self._broker_failed = self._broker_failed or isinstance(exc, kombu.exceptions.OperationalError | OSError)
            logger.exception(
                "could not carry out a fixed-time tick; retrying shortly",
                extra={"schedule": entry.name, "action": "send_failed"},
            )
            self._send_failed = True
            self._heap = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._leadership.resign()


def _has_policy(model: Any) -> bool:
    try:
        model.policy  # noqa: B018 - the reverse one-to-one raises when there is none
    except SchedulePolicy.DoesNotExist:
        return False
    return True


def carry_out(
    app: Any,
    policy_id: int,
    name: str,
    plan: ticks.TickPlan,
    *,
    producer: Any = None,
    options: dict[str, Any] | None = None,
) -> None:
    """Do what ``plan`` says for one schedule: record missed ticks, send ticks, advance ``last_tick``.

    ``last_tick`` moves only after every send went out; if beat dies in between, the next leader
    sends the same ticks again and the gate's ledger refuses whatever already ran.
    """
    log = {"schedule": name}
    if plan.missed:
        policy = SchedulePolicy.objects.filter(pk=policy_id).first()
        missed_policy = policy.missed_policy if policy is not None else MissedPolicy.SKIP
        recorded = store.record_missed_ticks(policy_id, plan.missed, MISSED_ERROR.format(policy=missed_policy))
        logger.warning(
            MISSED_LOG,
            extra={
                **log,
                "missed": len(plan.missed),
                "more_not_examined": plan.missed_more,
                "recorded": len(recorded),
                "first": plan.missed[0].isoformat(),
                "last": plan.missed[-1].isoformat(),
                "action": "missed",
            },
        )
        if policy is not None:
            store.prune_schedule_runs(policy_id, policy.successful_history_limit, policy.failed_history_limit)
    send_options = {k: v for k, v in (options or {}).items() if k in {"queue", "exchange", "routing_key", "priority"}}
    for send in plan.sends:
        app.send_task(
            tasknames.RUN_FIXED,
            # signed for this policy row: workers refuse unsigned ticks and those of a deleted schedule
            kwargs=messages.message_kwargs(name, send.tick, send.trigger, policy_id=policy_id),
            producer=producer,
            headers={"periodic_task_name": name, "celery_beat_task": True},
            retry_policy=broker.LEADER_SEND_RETRY_POLICY,
            **send_options,
        )
        logger.info(
            "tick sent", extra={**log, "tick": send.tick.isoformat(), "trigger": send.trigger, "action": "sent"}
        )
    if plan.advance_to is not None:
        store.advance_last_tick(policy_id, plan.advance_to)
