"""Timekeeper's exceptions: every error raised on purpose derives from ``SchedulingError``.

SchedulingError
 ├── UnknownJobKind                 no handler is registered for the kind
 ├── KindNotAllowed                 the caller may not schedule the kind (its Access refuses them)
 ├── InvalidPayload                 the payload fails the kind's schema or is not JSON
 │    └── PayloadTooLarge           the encoded payload is over the size limit
 ├── InvalidSchedule                bad due_at / delay (naive, both, neither, negative, out of range)
 │    ├── OverCallerLimit           an outside caller asks for more than the kind allows them
 │    │    ├── DueAtInPast          an outside caller's due_at is in the past (beyond the skew tolerance)
 │    │    └── RecurrenceTooFrequent an outside caller's recurrence runs closer than the minimum interval
 │    └── InvalidRecurrence         a recurrence rule that cannot work (no rule, both rules, ends before starts)
 ├── ReturnValueTooLarge            a Django task returned more than SCHEDULING_MAX_RETURN_VALUE_BYTES of JSON
 ├── OverCreationLimit              an owner creates too fast, or holds too many pending jobs or recurrences (429)
 ├── DelayTooLong                   a broker countdown would outlive the visibility timeout guard
 ├── BrokerNotConfigured            no Celery app / Redis broker to send to (scheduling.E004)
 ├── JobNotFound                    no job with that id or live key (or not the caller's)
 ├── OwnerDeleted                   a handler asked the owner of a job whose owner was deleted
 ├── JobStateConflict               the job is not in a state that allows the change
 │    ├── JobNotCancellable
 │    ├── JobNotReschedulable
 │    └── JobNotAbortable           abort() of a pending job (cancel it instead)
 │         └── JobAlreadyFinished   abort() of a job that finished before the abort arrived
 ├── KeyConflict                    on_conflict="error" and the key already has a waiting job
 │    └── DuplicateJob              on_conflict="error" and the unique window already holds a job like it
 ├── LockNotAcquired                an advisory lock is held by someone else
 ├── InvalidCronExpression          a cron expression or nickname cannot be parsed
 ├── UnknownTimeZone                a zone the tz database does not know
 ├── InvalidPolicy                  a fixed-time policy that cannot work (timeout >= interval ...)
 ├── RunNotRunning                  abort_schedule_run() of a fixed-time run that is not running (or no such run)
 ├── ScheduleNotFound               no fixed-time schedule (periodic task with a policy) has that name
 ├── RecurrenceNotFound             no recurrence with that id or key (or not the caller's)
 ├── RecurrenceKeyConflict          recur(..., on_conflict="error") and the owner already has the key
 └── RecurrenceStateConflict        the recurrence's state forbids the change (resume a cancelled one)
"""

from __future__ import annotations


class SchedulingError(Exception):
    """Root of every error Timekeeper raises on purpose."""


class UnknownJobKind(SchedulingError):
    """Raised when a job names a kind that no handler in ``tasks/`` registered."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"Unknown job kind {kind!r}: no handler is registered for it.")
        self.kind = kind


class KindNotAllowed(SchedulingError):
    """Raised at a door (API, admin) when the kind's ``Access`` does not let the caller schedule it."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"You may not schedule jobs of kind {kind!r} with this payload.")
        self.kind = kind


class InvalidPayload(SchedulingError):
    """Raised when a payload is not JSON-serialisable or fails its kind's JSON schema."""


class PayloadTooLarge(InvalidPayload):
    """Raised when a payload's JSON encoding is over ``SCHEDULING_MAX_PAYLOAD_BYTES``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"Payload is {size} bytes encoded; the limit is {limit} bytes.")
        self.size = size
        self.limit = limit


class InvalidSchedule(SchedulingError):
    """Raised for a bad due time: naive datetime, both or neither of due_at/delay, out of range."""


class OverCallerLimit(InvalidSchedule):
    """Raised at a door (the JSON API) when a caller asks more of a kind than its bounds allow them.

    ``field`` is what they asked for too much of (``max_attempts``, ``priority``, ``due_at``) and
    ``limit`` the most (or, for ``due_at``, the earliest) they may ask.
    """

    def __init__(self, message: str, *, field: str, limit: object) -> None:
        super().__init__(message)
        self.field = field
        self.limit = limit


class DueAtInPast(OverCallerLimit):
    """Raised at a door when a caller's due time is further in the past than the clock-skew tolerance."""


class RecurrenceTooFrequent(OverCallerLimit):
    """Raised at a door when a caller's recurrence (``every`` or cron) runs more often than the minimum interval."""


class ReturnValueTooLarge(SchedulingError):
    """Raised on the worker when a Django task's return value, as JSON, is over ``SCHEDULING_MAX_RETURN_VALUE_BYTES``.

    The attempt fails with this error (retried like any failure): nothing of the value is stored.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(
            f"The task's return value is {size} bytes of JSON, over SCHEDULING_MAX_RETURN_VALUE_BYTES ({limit}): "
            "store large results elsewhere (a file, a model) and return a reference to them."
        )


class OverCreationLimit(SchedulingError):
    """Raised at a door when an owner creates faster than the rate or holds more pending jobs than the quota.

    ``code`` is ``rate_limited`` or ``quota_exceeded``; ``retry_after`` the whole seconds to wait;
    ``limit`` the quota (``None`` for the rate).
    """

    def __init__(self, message: str, *, code: str, retry_after: int, limit: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
        self.limit = limit


class DelayTooLong(SchedulingError):
    """Raised when a broker countdown would not end safely before the broker's visibility timeout."""


class BrokerNotConfigured(SchedulingError):
    """Raised by ``defer()`` instead of sending when no Celery app or Redis broker is configured (scheduling.E004).

    Celery's fallback app would otherwise send the message to ``amqp://localhost``, silently.
    """


class JobNotFound(SchedulingError):
    """Raised when no job matches the id or live key (or it belongs to another owner)."""


class JobStateConflict(SchedulingError):
    """Raised when a job's current state forbids the requested change; ``state`` says which it is."""

    action = "change"

    def __init__(self, job_id: int, state: str) -> None:
        super().__init__(f"Job {job_id} is {state}; only a pending job can {self.action}.")
        self.job_id = job_id
        self.state = state


class JobNotCancellable(JobStateConflict):
    """Raised by ``cancel()`` when the job is no longer pending (claimed, done, cancelled, dead)."""

    action = "be cancelled"


class JobNotReschedulable(JobStateConflict):
    """Raised by ``reschedule()`` when the job is no longer pending."""

    action = "be rescheduled"


class JobNotAbortable(JobStateConflict):
    """Raised by ``abort()`` when the job is not claimed or running: pending (``cancel()`` it), or finished."""

    def __init__(self, job_id: int, state: str) -> None:
        SchedulingError.__init__(self, f"Job {job_id} is {state}; only a claimed or running job can be aborted.")
        self.job_id = job_id
        self.state = state


class JobAlreadyFinished(JobNotAbortable):
    """Raised by ``abort()`` when the job finished (done, dead, cancelled) before the abort arrived: it stays so."""

    def __init__(self, job_id: int, state: str) -> None:
        SchedulingError.__init__(
            self, f"Job {job_id} already finished ({state}) before the abort arrived; it stays {state}."
        )
        self.job_id = job_id
        self.state = state


class KeyConflict(SchedulingError):
    """Raised by ``schedule(..., on_conflict="error")`` when the key already has a job waiting to run.

    A running job alone does not raise: its successor is scheduled beside it.
    """

    def __init__(self, key: str, job_id: int) -> None:
        super().__init__(f"Key {key!r} already has a live job ({job_id}).")  # live: waiting to run
        self.key = key
        self.job_id = job_id


class DuplicateJob(KeyConflict):
    """Raised by ``schedule(..., unique_for=..., on_conflict="error")`` when the window already holds a job.

    The job of the same kind with the same key (or, without a key, the same payload) in the same
    window slot, in one of the ``unique_states``. A ``KeyConflict``, so every door answers it alike.
    """

    def __init__(self, key: str, job_id: int, state: str) -> None:
        SchedulingError.__init__(
            self, f"A job like this one ({job_id}, {state}) already exists within its unique window."
        )
        self.key = key
        self.job_id = job_id
        self.state = state


class LockNotAcquired(SchedulingError):
    """Raised when an advisory lock is already held by another session."""


class InvalidCronExpression(SchedulingError):
    """Raised when a cron expression or nickname cannot be parsed."""


class UnknownTimeZone(SchedulingError):
    """Raised when a schedule names a time zone the tz database does not know."""


class InvalidPolicy(SchedulingError):
    """Raised when a fixed-time schedule's policy cannot work, e.g. a timeout not shorter than its interval."""


class RunNotRunning(SchedulingError):
    """Raised by ``abort_schedule_run()`` when the run finished before the abort arrived (or no such run exists)."""

    def __init__(self, run_id: int, state: str | None) -> None:
        what = "does not exist" if state is None else f"already finished ({state}) before the abort arrived"
        shown = run_id if not isinstance(run_id, int) or run_id.bit_length() <= 64 else "past bigint"
        super().__init__(f"Schedule run {shown} {what}.")
        self.run_id = run_id
        self.state = state


class ScheduleNotFound(SchedulingError):
    """Raised when no fixed-time schedule (a periodic task with a policy) has the given name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"No fixed-time schedule is named {name!r}.")
        self.name = name


class OwnerDeleted(SchedulingError):
    """Raised by ``job.owner_id`` when the job's owner was deleted while it was claimed or running.

    Its owner is then empty in the database, which must not read as "the system's job": a handler
    that checks the owner fails the attempt instead of acting with the system's rights.
    """

    def __init__(self, job_id: int, former_owner: str) -> None:
        super().__init__(f"Job {job_id} belonged to {former_owner}, who was deleted; it does not run as the system.")
        self.job_id = job_id
        self.former_owner = former_owner


__all__ = [
    "BrokerNotConfigured",
    "DelayTooLong",
    "DueAtInPast",
    "DuplicateJob",
    "InvalidCronExpression",
    "InvalidPayload",
    "InvalidPolicy",
    "InvalidRecurrence",
    "InvalidSchedule",
    "JobAlreadyFinished",
    "JobNotAbortable",
    "JobNotCancellable",
    "JobNotFound",
    "JobNotReschedulable",
    "JobStateConflict",
    "KeyConflict",
    "KindNotAllowed",
    "LockNotAcquired",
    "OverCallerLimit",
    "OverCreationLimit",
    "OwnerDeleted",
    "PayloadTooLarge",
    "RecurrenceKeyConflict",
    "RecurrenceNotFound",
    "RecurrenceStateConflict",
    "RecurrenceTooFrequent",
    "ReturnValueTooLarge",
    "RunNotRunning",
    "ScheduleNotFound",
    "SchedulingError",
    "UnknownJobKind",
    "UnknownTimeZone",
]


class InvalidRecurrence(InvalidSchedule):
    """Raised for a recurrence rule that cannot work: neither or both of cron/every, ends_at not after starts_at."""


class RecurrenceNotFound(SchedulingError):
    """Raised when no recurrence matches the id or key (or it belongs to another owner)."""


class RecurrenceKeyConflict(SchedulingError):
    """Raised by ``recur(..., on_conflict="error")`` when the owner already has a recurrence with the key."""

    def __init__(self, key: str, recurrence_id: int) -> None:
        super().__init__(f"Key {key!r} already names recurrence {recurrence_id}.")
        self.key = key
        self.recurrence_id = recurrence_id


class RecurrenceStateConflict(SchedulingError):
    """Raised when a recurrence's state forbids the change (a cancelled or ended one cannot resume or change)."""

    def __init__(self, recurrence_id: int, state: str, action: str) -> None:
        super().__init__(f"Recurrence {recurrence_id} is {state}; it cannot {action}.")
        self.recurrence_id = recurrence_id
        self.state = state
