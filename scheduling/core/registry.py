"""The registry of job kinds: ``@registry.handler("reminders.trial_ending", schema=..., ...)``.

Handlers are found the Django way and imported on first use, so the web process, workers and beat
all know the same kinds: the ``jobs`` module of every installed app (``billing/jobs.py``), like
``admin.py`` for the admin, plus every module of the packages named in
``SCHEDULING_HANDLER_PACKAGES`` (default none) for handlers kept elsewhere.
A handler receives a ``Job`` and does its work; it never touches Timekeeper's tables or locks.

Who may schedule a kind from outside is part of its contract: ``api=registry.Access(...)`` names a
Django permission, a predicate on (user, payload), or both. A kind without ``api`` cannot be
scheduled through the JSON API, nor through the admin's add form by anyone but a superuser; code
calling ``scheduling.api`` is trusted. Handlers acting on an entity named in the payload check
that it belongs to ``job.owner_id`` (None: the job is the system's, scheduled by code).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import importlib
import logging
import pkgutil
import random
import re
import threading
from collections.abc import Callable
from typing import Any

import jsonschema

from scheduling.core import aborts, conf, exceptions

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential backoff with equal jitter: half the step is fixed, half random, capped."""

    base_seconds: float = 10.0
    cap_seconds: float = 3600.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        step = min(self.cap_seconds, self.base_seconds * (2 ** max(0, attempt - 1)))
        return step / 2 + (rng or random).uniform(0, step / 2)


class Mechanism(enum.StrEnum):
    """Which mechanism ran a job: its value is the name of the package that owns it."""

    DUE_AT = "due_at"  # a scheduled_job row claimed from the table (scheduling.due_at)
    DEFERRALS = "deferrals"  # a broker countdown (scheduling.deferrals)
    FIXED = "fixed"  # a fixed-time schedule's run (scheduling.fixed)


_IDEMPOTENCY_PREFIX: dict[str, str] = {Mechanism.DEFERRALS: "broker"}  # a deferral's key: "broker:<id>"


@dataclasses.dataclass(frozen=True)
class Job:
    """What a handler receives: a claimed table row or a broker deferral, read-only."""

    kind: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    due_at: dt.datetime | None
    id: int | None = None  # the ScheduledJob id on the table path
    token: str | None = None  # the claim's fencing token on the table path
    mechanism: str = Mechanism.DUE_AT  # a Mechanism value: due_at, deferrals or fixed
    ref: str = ""  # the deferral's task id, or the fixed-time run id

    @functools.cached_property
    def owner_id(self) -> int | None:
        """The user the job belongs to; None for the system's jobs (broker deferrals, fixed-time runs).

        Read from the job's row on first use (one primary-key lookup, only for handlers that ask).
        ``OwnerDeleted`` when its owner was deleted after it was claimed: it is nobody's, not the system's.
        """
        if self.mechanism != Mechanism.DUE_AT or self.id is None:
            return None
        from scheduling.core import store

        owner = store.job_owner(self.id)
        if owner is None:
            return None
        if owner.owner_id is None and owner.former_owner:
            raise exceptions.OwnerDeleted(self.id, owner.former_owner)
        return owner.owner_id

    @functools.cached_property
    def key(self) -> str | None:
        """The job's business key (None without one, and off the table path), read from its row on first use.

        The chain recipe: a handler schedules its entity's next run under its own key
        (``api.schedule(job.kind, payload, key=job.key, owner=job.owner_id, delay=...)``).
        """
        if self.mechanism != Mechanism.DUE_AT or self.id is None:
            return None
        from scheduling.core import store

        return store.job_key(self.id)

    def abort_requested(self) -> bool:
        """Whether an operator aborted this job (``api.abort``), as this worker's heartbeat last saw it.

        An atomic handler is interrupted wherever it is; a committing one (``atomic=False``) is too,
        and may also poll this between steps to stop at a point of its choosing (raise, or return).
        Seen within about one heartbeat interval (``SCHEDULING_HEARTBEAT_SECONDS``); always False off
        the table path and for fixed-time runs, whose runner reads its own aborts.
        """
        return aborts.requested(self.id, self.token) is not None

    @property
    def idempotency_key(self) -> str:
        """Stable across re-runs of the same job (not of the same attempt): key side effects on it."""
        if self.mechanism == Mechanism.DUE_AT:
            return f"job:{self.id}"
        # The prefixes predate the mechanisms' names and stay: keys already stored by handlers still match.
        return f"{_IDEMPOTENCY_PREFIX.get(self.mechanism, self.mechanism)}:{self.ref}"


class HandlerOutcome(Exception):
    """A handler's choice of how its attempt ends, other than returning or failing (raise a subclass).

    Each ends the attempt like a failure for its writes (an atomic job's writes and on_commit
    callbacks are rolled back; a committing job's commits stand), then the job goes where the
    subclass says (docs/architecture.md, "Handler-chosen outcomes"). ``outcome`` is the value the
    attempt records (an ``AttemptOutcome``).
    """

    outcome = ""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


MAX_DELAY_SECONDS = 10 * 366 * 86_400  # ten years: a job's due time is at most this far ahead (validation's too)


def _seconds(value: float | dt.timedelta, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_DELAY_SECONDS:
        # Past ten years the job could not be stored again (a deferral's continuation row was refused: lost).
        raise exceptions.SchedulingError(
            f"{what}(...) takes seconds from 0 to {MAX_DELAY_SECONDS} (ten years, or a timedelta), not {value!r}."
        )
    return float(seconds)


class Snooze(HandlerOutcome):
    """Run the job again after ``seconds``, no attempt charged: "not yet" (a resource not ready).

    A job may snooze at most its kind's ``max_snoozes`` times (``SCHEDULING_MAX_SNOOZES`` unless the
    kind says); the snooze after that is a failure (charged, retried after the backoff, or dead).
    """

    outcome = "snoozed"

    def __init__(self, seconds: float | dt.timedelta) -> None:
        self.seconds = _seconds(seconds, "Snooze")
        super().__init__(f"snoozed for {self.seconds:g}s")


class RetryAfter(HandlerOutcome):
    """This attempt failed and is charged; retry after ``seconds`` instead of the backoff (a 429's Retry-After).

    Dead, like any failure, when the job's attempts are spent.
    """

    outcome = "retry_after"

    def __init__(self, seconds: float | dt.timedelta, reason: str = "") -> None:
        self.seconds = _seconds(seconds, "RetryAfter")
        super().__init__(reason or f"retry after {self.seconds:g}s")


class Discard(HandlerOutcome):
    """This failure is permanent: no further attempt, the job is dead with ``reason``."""

    outcome = "discarded"


class Cancel(HandlerOutcome):
    """The work is no longer wanted: the job is cancelled with ``reason`` (not a failure)."""

    outcome = "cancelled"


@dataclasses.dataclass(frozen=True)
class Access:
    """Who may schedule a kind from outside: a Django permission, a predicate, or both (all must pass).

    ``Access()`` lets any authenticated, active user schedule the kind. The predicate receives the
    user and the payload (already valid for the kind's schema) and says whether that user may ask
    for that work, e.g. "the trial in the payload is theirs".

    It also bounds what a caller may ask for: ``max_attempts`` (default: the kind's own), so that
    attempts x the kind's timeout stays within ``SCHEDULING_API_MAX_JOB_SECONDS`` (checked when the
    kind registers), and ``max_priority`` (default: the kind's own priority) for callers without
    ``scheduling.prioritize_job``, who may go up to 9.
    """

    permission: str | None = None  # "app_label.codename", checked with user.has_perm
    predicate: Callable[[Any, dict[str, Any]], bool] | None = None
    max_attempts: int | None = None  # the most attempts a caller may ask for (None: the kind's max_attempts)
    max_priority: int | None = None  # the highest priority without PRIORITIZE_PERMISSION (None: the kind's)

    def may_use(self, user: Any) -> bool:
        """Whether ``user`` may schedule the kind at all, before any payload is read (the permission)."""
        if user is None or not getattr(user, "is_active", False) or not getattr(user, "is_authenticated", False):
            return False
        return self.permission is None or bool(user.has_perm(self.permission))

    def allows(self, user: Any, payload: dict[str, Any]) -> bool:
        """Whether ``user`` may schedule this kind with ``payload``."""
        if not self.may_use(user):
            return False
        return self.predicate is None or bool(self.predicate(user, payload))


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one payload of a kind may be; every door reads them from ``Kind.limits`` (never from settings).

    ``@handler(..., limits=Limits(max_payload_bytes=...))`` sets a kind's own; a field left ``None``
    is the setting's (``SCHEDULING_MAX_PAYLOAD_BYTES``, ``SCHEDULING_MAX_PAYLOAD_DEPTH``), read when
    asked, so a changed setting applies at once. ``validation.encode_payload`` enforces them for the
    Python API, the JSON API, the admin, the commands and fixed-time schedules alike.
    """

    max_payload_bytes: int | None = None  # the payload's compact JSON encoding, in bytes
    max_payload_depth: int | None = None  # levels of nested lists/objects

    def resolved(self) -> Limits:
        """These limits with every ``None`` replaced by its setting."""
        settings = conf.get()
        return Limits(
            max_payload_bytes=self.max_payload_bytes or settings.max_payload_bytes,
            max_payload_depth=self.max_payload_depth or settings.max_payload_depth,
        )

    def check(self, name: str) -> None:
        """Raise ``SchedulingError`` unless each limit given is a whole number above 0."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise exceptions.SchedulingError(
                    f"Job kind {name!r}: Limits({field.name}=...) must be a whole number above 0 "
                    f"or None, not {value!r}."
                )


DEFAULT_QUEUE = "default"  # a kind's queue unless it names one; its batches go to Celery's default queue
QUEUE_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


def celery_queue(queue: str, default: str) -> str:
    """The Celery queue of Timekeeper's ``queue``: ``default`` (Celery's default queue) for "default", else its name."""
    return default if queue == DEFAULT_QUEUE else queue


RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}  # "10/s", "1/m", "100/h", "5/2s"
MAX_RATE_LIMIT = 1_000_000  # the most starts per period a rate takes
MAX_RATE_PERIOD_SECONDS = 7 * 86400.0  # the longest period (a week)


PARTITION_FIELD = re.compile(r"[A-Za-z0-9_.\-]{1,100}")  # a rate's partition_by: a payload field's name


@dataclasses.dataclass(frozen=True)
class Rate:
    """At most ``limit`` starts of a kind per ``per_seconds`` (a sliding window), cluster-wide.

    Decided at the claim (``due_at/sql/claim.sql``): a claim takes at most the limit minus the
    starts of the last ``per_seconds``, under the kind's control-row lock, so the limit is exact
    with any number of claimers. ``partition_by`` names a payload field: the limit then holds for
    each of its values apart ("10 a second per partner"); a job without the field is in the ''
    partition. ``Rate.parse("10/s")``; units s, m, h, d, optionally with a count ("5/2s").
    """

    limit: int
    per_seconds: float = 1.0
    partition_by: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or not 1 <= self.limit <= MAX_RATE_LIMIT:
            raise exceptions.SchedulingError(
                f"A rate's limit must be a whole number from 1 to {MAX_RATE_LIMIT}, not {self.limit!r}."
            )
        per = self.per_seconds
        if isinstance(per, bool) or not isinstance(per, (int, float)) or not 0 < per <= MAX_RATE_PERIOD_SECONDS:
            raise exceptions.SchedulingError(
                f"A rate's period must be seconds above 0, at most {MAX_RATE_PERIOD_SECONDS:g}, not {per!r}."
            )
        if not isinstance(self.partition_by, str) or (
            self.partition_by and not PARTITION_FIELD.fullmatch(self.partition_by)
        ):
            raise exceptions.SchedulingError(
                "A rate's partition_by must be a payload field name (at most 100 letters, digits, '_', '-' or '.')."
            )

    @classmethod
    def parse(cls, text: str, partition_by: str = "") -> Rate:
        """``"10/s"`` -> Rate(10, 1.0); ``"5/2s"`` -> Rate(5, 2.0); ``"1/m"``, ``"100/h"``, ``"1000/d"``."""
        count, sep, unit = str(text).strip().partition("/")
        amount = unit.rstrip("smhd")
        ascii_digits = count.isascii() and count.isdecimal()  # int() refuses "\u00b2"; no other script's digits
        if not sep or not ascii_digits or not amount.isascii() or unit[len(amount) :] not in RATE_UNITS:
            raise exceptions.SchedulingError(f"A rate reads like '10/s', '1/m', '100/h' or '5/2s', not {text!r}.")
        try:
            scale = float(amount) if amount else 1.0
        except ValueError:
            raise exceptions.SchedulingError(
                f"A rate reads like '10/s', '1/m', '100/h' or '5/2s', not {text!r}."
            ) from None
        return cls(int(count), scale * RATE_UNITS[unit[len(amount) :]], partition_by)

    @classmethod
    def of(cls, value: Rate | str) -> Rate:
        """A ``Rate`` as given, or parsed from its text."""
        return value if isinstance(value, Rate) else cls.parse(value)

    def __str__(self) -> str:
        per = next((u for u, secs in RATE_UNITS.items() if secs == self.per_seconds), f"{self.per_seconds:g}s")
        return f"{self.limit}/{per}" + (f" per {self.partition_by}" if self.partition_by else "")


@dataclasses.dataclass(frozen=True)
class Kind:
    """A registered job kind and how it runs."""

    name: str
    func: Callable[[Job], Any]
    schema: dict[str, Any] | None
    timeout_seconds: float
    max_attempts: int
    backoff: Backoff
    lease_seconds: int
    batch_size: int
    description: str
    atomic: bool = True  # the handler's database writes and the job's outcome commit in one transaction
    priority: int = 0  # 0-9, the default priority of its jobs: among due jobs, higher is claimed first
    api: Access | None = None  # None: not schedulable through the API (the admin: superusers only)
    critical: bool = False  # /healthz counts its overdue jobs, whoever owns them (and the system's jobs of any kind)
    own_limits: Limits = Limits()  # as registered; the doors read ``limits`` (settings filled in)
    own_max_snoozes: int | None = None  # as registered (None: SCHEDULING_MAX_SNOOZES); read ``max_snoozes``
    unique_for_seconds: float | None = None  # its jobs' uniqueness window unless a job says (None: not unique)
    unique_states: tuple[str, ...] = ("pending", "claimed", "running", "done")  # states that hold the window
    rate: Rate | None = None  # the registered rate limit (an operator's api.set_rate replaces it at runtime)
    queue: str = DEFAULT_QUEUE  # the named queue its batches go to (workers serve queues with -Q)

    @property
    def max_snoozes(self) -> int:
        """How many times a job of this kind may ``Snooze``: its own bound, else ``SCHEDULING_MAX_SNOOZES``."""
        return conf.get().max_snoozes if self.own_max_snoozes is None else self.own_max_snoozes

    @property
    def limits(self) -> Limits:
        """The kind's payload limits, every field set: its own, else the settings'. The one place doors read."""
        return self.own_limits.resolved()

    def allows(self, user: Any, payload: dict[str, Any]) -> bool:
        """Whether ``user`` may schedule this kind from outside with ``payload`` (the kind's ``Access``)."""
        return self.api is not None and self.api.allows(user, payload)

    def usable_by(self, user: Any) -> bool:
        """Whether ``user`` may schedule this kind from outside at all (its permission; the predicate comes later)."""
        return self.api is not None and self.api.may_use(user)

    @property
    def caller_max_attempts(self) -> int:
        """The most attempts an outside caller may ask for: the ``Access`` bound, else the kind's own."""
        bound = self.api.max_attempts if self.api is not None else None
        return self.max_attempts if bound is None else bound

    def caller_max_priority(self, user: Any) -> int:
        """The highest priority ``user`` may ask for: 9 with ``scheduling.prioritize_job``, else the kind's bound."""
        if user is not None and getattr(user, "is_active", False) and user.has_perm(PRIORITIZE_PERMISSION):
            return MAX_PRIORITY
        bound = self.api.max_priority if self.api is not None else None
        return self.priority if bound is None else bound

    def offered_to(self, user: Any) -> bool:
        """Whether a form should list the kind for ``user`` (its permission holds; a predicate is judged later)."""
        if self.api is None or not getattr(user, "is_active", False):
            return False
        return self.api.permission is None or bool(user.has_perm(self.api.permission))

    @functools.cached_property
    def validator(self) -> jsonschema.protocols.Validator:
        """The kind's schema compiled once (jsonschema.validate would re-check the schema every call)."""
        assert self.schema is not None
        return jsonschema.validators.validator_for(self.schema)(self.schema)

    def validate(self, payload: Any) -> None:
        """Raise ``InvalidPayload`` unless ``payload`` is a JSON object that passes the schema."""
        if not isinstance(payload, dict):
            raise exceptions.InvalidPayload(
                f"Payload for {self.name} must be a JSON object, got {type(payload).__name__}."
            )
        if self.schema is not None:
            try:
                self.validator.validate(payload)
            except jsonschema.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
                raise exceptions.InvalidPayload(
                    f"Payload for {self.name} fails its schema at {where}: {exc.message}"
                ) from None
            except RecursionError:
                raise exceptions.InvalidPayload(f"Payload for {self.name} is nested too deeply.") from None


_kinds: dict[str, Kind] = {}
_loaded = False
_load_lock = threading.Lock()


MIN_PRIORITY, MAX_PRIORITY = 0, 9  # scheduling.models has the same bounds (its check constraint)
PRIORITIZE_PERMISSION = "scheduling.prioritize_job"  # lets an API caller ask for any priority, up to MAX_PRIORITY
MAX_JOB_SECONDS_SETTING = "SCHEDULING_API_MAX_JOB_SECONDS"


def is_priority(value: Any) -> bool:
    """Whether ``value`` is a job priority: a whole number (not a bool) from MIN_PRIORITY to MAX_PRIORITY."""
    return isinstance(value, int) and not isinstance(value, bool) and MIN_PRIORITY <= value <= MAX_PRIORITY


def handler(
    name: str,
    *,
    schema: dict[str, Any] | None = None,
    timeout: float | None = None,
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    lease_seconds: int | None = None,
    batch_size: int | None = None,
    atomic: bool = True,
    priority: int = 0,
    api: Access | None = None,
    critical: bool = False,
    limits: Limits | None = None,
    max_snoozes: int | None = None,
    unique_for: float | dt.timedelta | None = None,
    unique_states: tuple[str, ...] | list[str] | None = None,
    rate: Rate | str | None = None,
    queue: str = "default",
) -> Callable[[Callable[[Job], Any]], Callable[[Job], Any]]:
    """Register the decorated function as the handler of job kind ``name``.

    ``api``: who may schedule it from outside and the bounds of what they may ask (``Access``); a
    kind whose callers could hold workers longer than ``SCHEDULING_API_MAX_JOB_SECONDS`` (their
    most attempts x ``timeout``) is refused here. ``critical``: ``/healthz`` counts its overdue
    jobs in the backlog (besides the system's own jobs); other owners' jobs never flip it.
    ``limits``: the kind's own payload limits (``Limits``; a field left ``None`` is the setting's).
    ``max_snoozes``: how many times a job may ``raise Snooze(...)`` before the next one is a failure
    (None: ``SCHEDULING_MAX_SNOOZES``). ``unique_for`` / ``unique_states``: the default uniqueness
    window of its jobs and the states that hold it (``schedule(unique_for=...)``; checked as there).
    ``rate``: at most so many starts per period, cluster-wide (``"10/s"`` or ``Rate(10, per_seconds=1,
    partition_by="partner")``); an operator's ``api.set_rate`` replaces it at runtime.
    ``queue``: the named queue the kind belongs to ("default" unless set): its batches are sent to
    that queue (``celery_queue``), served by the workers started with ``-Q`` naming it, and the
    claim keeps each queue's room apart.

    ``atomic`` (the default): on the due_at path the handler runs inside the transaction that
    records its outcome, so its database writes and the job's ``done`` commit together or not at
    all (a ``kill -9`` mid-job leaves no effect, and the re-run is the only one that counts);
    ``transaction.on_commit`` callbacks run once that is durable, which is where an email goes.
    ``atomic=False`` for a handler that must commit as it goes (long jobs, other databases).
    """

    def register(func: Callable[[Job], Any]) -> Callable[[Job], Any]:
        if name in _kinds and _kinds[name].func is not func:
            raise exceptions.SchedulingError(f"Job kind {name!r} is registered twice.")
        if schema is not None:
            jsonschema.Draft202012Validator.check_schema(schema)
        if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
            raise exceptions.SchedulingError(
                f"Job kind {name!r}: queue must be a name of letters, digits, '.', '_' or '-' (at most 100), "
                f"not {queue!r}."
            )
        if not is_priority(priority):
            raise exceptions.SchedulingError(
                f"Job kind {name!r}: priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} "
                f"(higher runs first), not {priority!r}."
            )
        kind = Kind(
            name=name,
            func=func,
            schema=schema,
            timeout_seconds=float(timeout if timeout is not None else conf.get().default_timeout_seconds),
            max_attempts=int(max_attempts or conf.get().default_max_attempts),
            backoff=backoff or Backoff(),
            lease_seconds=int(lease_seconds or conf.get().lease_seconds),
            batch_size=int(batch_size or conf.get().default_batch_size),
            description=(func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else "",
            atomic=atomic,
            priority=priority,
            api=api,
            critical=critical,
            own_limits=limits or Limits(),
            own_max_snoozes=max_snoozes,
            rate=None if rate is None else Rate.of(rate),
            queue=queue,
        )
        if unique_for is not None or unique_states is not None:
            from scheduling.core import options  # options imports this module

            kind = dataclasses.replace(
                kind,
                unique_for_seconds=None if unique_for is None else options.check_unique_for(unique_for),
                unique_states=kind.unique_states
                if unique_states is None
                else options.check_unique_states(unique_states),
            )
        kind.own_limits.check(name)
        bad_snoozes = isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or max_snoozes < 0
        if max_snoozes is not None and bad_snoozes:
            raise exceptions.SchedulingError(
                f"Job kind {name!r}: max_snoozes must be a whole number from 0, or None, not {max_snoozes!r}."
            )
        check_caller_bounds(kind)
        _kinds[name] = kind
        return func

    return register


def check_caller_bounds(kind: Kind) -> None:
    """Raise ``SchedulingError`` unless the bounds ``kind.api`` sets on outside callers are sound.

    Its attempts are a whole number from the kind's own ``max_attempts`` (what a caller who asks
    nothing gets) up; times the timeout they stay within ``SCHEDULING_API_MAX_JOB_SECONDS``; its
    priority bound is a priority from the kind's own up.
    """
    if kind.api is None:
        return
    attempts, bound = kind.caller_max_attempts, kind.api.max_attempts
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < kind.max_attempts):
        raise exceptions.SchedulingError(
            f"Job kind {kind.name!r}: Access(max_attempts=...) must be a whole number of at least the kind's "
            f"max_attempts ({kind.max_attempts}), not {bound!r}."
        )
    limit = conf.get().api_max_job_seconds
    if limit and attempts * kind.timeout_seconds > limit:
        raise exceptions.SchedulingError(
            f"Job kind {kind.name!r}: an API caller's job could hold a worker for {attempts} attempts x "
            f"{kind.timeout_seconds:g} s = {attempts * kind.timeout_seconds:g} s, over {MAX_JOB_SECONDS_SETTING} "
            f"({limit:g} s). Lower its timeout or max_attempts (or Access(max_attempts=...))."
        )
    top = kind.api.max_priority
    if top is not None and (not is_priority(top) or top < kind.priority):
        raise exceptions.SchedulingError(
            f"Job kind {kind.name!r}: Access(max_priority=...) must be a priority from the kind's own "
            f"({kind.priority}) to {MAX_PRIORITY}, not {top!r}."
        )


JOBS_MODULE = "jobs"  # the module of an installed app that holds its handlers (billing/jobs.py)
SKIPPED_IN_PACKAGES = {"models", "admin", "apps", "views", "urls", "migrations", "tests"}  # not handler modules


def autodiscover() -> None:
    """Import every handler module once, so their decorators run.

    The ``jobs`` module of each installed app (Timekeeper's own app has none: its engine is
    ``scheduling.due_at``), then every module of each ``SCHEDULING_HANDLER_PACKAGES`` package.
    An error inside a handler module propagates: a missing handler must not look like a missing module.
    """
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        for module_name in handler_modules():
            importlib.import_module(module_name)
        _loaded = True


def handler_modules() -> list[str]:
    """The modules ``autodiscover()`` imports, in order (raises ImportError for an unknown handler package)."""
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    names = [
        f"{app_config.name}.{JOBS_MODULE}"
        for app_config in apps.get_app_configs()
        if module_has_submodule(app_config.module, JOBS_MODULE)
    ]
    for package_name in conf.get().handler_packages:
        package = importlib.import_module(package_name)
        names.extend(
            info.name
            for info in pkgutil.iter_modules(package.__path__, prefix=f"{package_name}.")
            if info.name.rsplit(".", 1)[-1] not in SKIPPED_IN_PACKAGES
        )
    return names


_finders: list[Callable[[str], bool]] = []  # called in order for a kind not registered yet (add_finder)


def add_finder(finder: Callable[[str], bool]) -> None:
    """Ask ``finder(name)`` for a kind that is not registered: it may register it (True) or not (False).

    Django tasks use it (``scheduling.backends``): a task is found by its module path wherever it is
    defined under an installed app, whether or not this process imported its module at start.
    """
    if finder not in _finders:
        _finders.append(finder)


def get(name: str) -> Kind:
    """The registered kind ``name`` (asking the finders for one not registered yet), or ``UnknownJobKind``."""
    if not isinstance(name, str):  # None or a list: an AttributeError or a TypeError further down
        raise exceptions.UnknownJobKind(str(name))
    autodiscover()
    try:
        return _kinds[name]
    except KeyError:
        pass
    for finder in list(_finders):
        if finder(name) and name in _kinds:
            return _kinds[name]
    raise exceptions.UnknownJobKind(name)


def all_kinds() -> dict[str, Kind]:
    """Every registered kind, by name."""
    autodiscover()
    return dict(_kinds)


def largest_limits() -> Limits:
    """The largest of every kind's limits (and the settings'): what a door may read before it knows the kind."""
    every = [Limits().resolved(), *(kind.limits for kind in all_kinds().values())]
    return Limits(
        max_payload_bytes=max(limits.max_payload_bytes or 0 for limits in every),
        max_payload_depth=max(limits.max_payload_depth or 0 for limits in every),
    )


__all__ = [
    "DEFAULT_QUEUE",
    "PRIORITIZE_PERMISSION",
    "Access",
    "Backoff",
    "Cancel",
    "Discard",
    "HandlerOutcome",
    "Job",
    "Kind",
    "Limits",
    "Mechanism",
    "Rate",
    "RetryAfter",
    "Snooze",
    "all_kinds",
    "autodiscover",
    "celery_queue",
    "get",
    "handler",
    "handler_modules",
    "largest_limits",
]
