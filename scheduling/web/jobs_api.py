"""The jobs JSON API: ``/api/jobs/`` (list, create), ``/api/jobs/<id>`` (get), ``.../cancel|reschedule|abort``.

Plain Django views over ``scheduling.api``: every check (kind, payload, time) is the API's, so a
request gets the same answer as a call to ``schedule()``, and an error stores or changes nothing
(each write runs in one transaction). Rows belong to their owner: another caller gets 404. Seeing
everyone's jobs takes the admin's ``scheduling.view_scheduledjob`` permission, changing them
``scheduling.change_scheduledjob`` (the staff flag alone grants nothing here either).

A kind is schedulable here only if it declares ``api=registry.Access(...)`` and that access lets the
caller schedule it with that payload (403 otherwise). Access is judged before the payload: an
unknown kind and a kind the caller may not use get one answer (403 ``kind_not_allowed``), whatever
the payload, so neither tells which kinds exist or what their schemas say. Keys are per owner: a
key only ever meets the caller's own job, and another owner's use of the same key is neither
revealed nor touched.

Limits a caller cannot lift (docs/security.md lists them with their settings): the kind's bounds
on attempts and priority (``Access``; ``scheduling.prioritize_job`` lifts the priority one), no
due time in the past (beyond a clock-skew tolerance), and per owner a create rate and a pending
quota (429 with ``Retry-After``; superusers are exempt from these two).

Status codes: 400 the request is wrong (with the reason), 401 no or bad credentials, 403 failed
CSRF check (session callers) or a kind (or change) the caller may not ask for, 404 no such job for
this caller, 405 wrong method, 409 the job's state forbids the change (or on_conflict="error" met
the caller's own live job for the key), 413 body or payload over the limit, 415 not JSON, 429 over
the create rate or the pending quota, 500 a bug: answered with a generic body and logged with the
traceback's frames and exception types only, never an exception's message (it may quote payload
text, as a ``ValueError`` repr does).
The OpenAPI document is served at ``/api/jobs/openapi.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from scheduling import api
from scheduling.core import audit, exceptions, executor, registry, validation
from scheduling.models import AuditDoor, JobState, ScheduledJob
from scheduling.web import auth, paging

logger = logging.getLogger(__name__)

ENVELOPE_ALLOWANCE_BYTES = 16 * 1024  # a request body may exceed the payload limit by this much (the other fields)
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_DATETIME_TEXT = 64  # characters: no ISO-8601 date-time is longer
CREATE_FIELDS = frozenset(
    {
        "kind",
        "payload",
        "due_at",
        "delay",
        "key",
        "on_conflict",
        "max_attempts",
        "priority",
        "unique_for",
        "unique_states",
    }
)
RESCHEDULE_FIELDS = frozenset({"due_at", "delay"})
LIST_PARAMETERS = frozenset({"state", "kind", "key", "page", "page_size", "cursor"})
LIST_ORDER = ("due_at", "id")  # unique together; an owner's walk reads scheduledjob_owner_due_idx


class ApiError(Exception):
    """An error answer: HTTP status, a stable code, a message for people, extra fields, and headers."""

    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra
        self.headers = headers or {}


def error_response(exc: ApiError, headers: dict[str, str] | None = None) -> JsonResponse:
    body = {"error": {"status": exc.status, "code": exc.code, "message": exc.message, **exc.extra}}
    response = JsonResponse(body, status=exc.status, encoder=DjangoJSONEncoder)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def from_scheduling_error(exc: exceptions.SchedulingError) -> ApiError:
    """The HTTP answer for an error of ``scheduling.api``."""
    if isinstance(exc, exceptions.PayloadTooLarge):
        return ApiError(413, "payload_too_large", str(exc), size=exc.size, limit=exc.limit)
    if isinstance(exc, exceptions.UnknownJobKind):
        return ApiError(400, "unknown_kind", str(exc))
    if isinstance(exc, exceptions.KindNotAllowed):
        return ApiError(403, "kind_not_allowed", str(exc), kind=exc.kind)
    if isinstance(exc, exceptions.InvalidPayload):
        return ApiError(400, "invalid_payload", str(exc))
    if isinstance(exc, exceptions.OverCreationLimit):
        return _creation_error(exc)
    if isinstance(exc, exceptions.DueAtInPast):
        return ApiError(400, "due_at_in_past", str(exc), field="due_at")
    if isinstance(exc, exceptions.OverCallerLimit):
        return ApiError(400, "over_limit", str(exc), field=exc.field, limit=exc.limit)
    if isinstance(exc, exceptions.InvalidSchedule):
        return ApiError(400, "invalid_schedule", str(exc))
    if isinstance(exc, exceptions.JobNotFound):
        return ApiError(404, "not_found", "No such job.")
    if isinstance(exc, exceptions.JobStateConflict):
        return ApiError(409, "state_conflict", str(exc), job_id=exc.job_id, state=exc.state)
    if isinstance(exc, exceptions.DuplicateJob):
        return ApiError(409, "duplicate_job", str(exc), job_id=exc.job_id, state=exc.state)
    if isinstance(exc, exceptions.KeyConflict):
        return ApiError(409, "key_conflict", str(exc), key=exc.key, job_id=exc.job_id)
    return ApiError(400, "invalid_request", str(exc))


# --- Request reading --------------------------------------------------------------------------------


def max_body_bytes() -> int:
    """The largest body read: the largest kind's payload limit plus the envelope (the kind is not known yet)."""
    return (registry.largest_limits().max_payload_bytes or 0) + ENVELOPE_ALLOWANCE_BYTES


def read_json(request: HttpRequest, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object; raises ``ApiError`` 415, 413 or 400. ``optional``: an empty body is {}."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "bad_request", "Content-Length is not a number.") from None
    if length > max_body_bytes():
        raise ApiError(413, "body_too_large", f"The body is {length} bytes; the limit is {max_body_bytes()} bytes.")
    if optional and length == 0:
        return {}
    if request.content_type != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Send JSON with 'Content-Type: application/json', not {request.content_type!r}.",
        )
    body = request.body
    if len(body) > max_body_bytes():
        raise ApiError(413, "body_too_large", f"The body is over the {max_body_bytes()} byte limit.")
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except RecursionError:
        raise ApiError(400, "invalid_json", "The JSON is nested too deeply.") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, "invalid_json", f"The body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", f"The body must be a JSON object, not {type(data).__name__}.")
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_fields(data: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ApiError(
            400, "unknown_field", f"Unknown field(s): {', '.join(unknown)}. Allowed: {', '.join(sorted(allowed))}."
        )


def parse_due_at(value: Any) -> dt.datetime:
    """An ISO-8601 date-time with an offset; naive, impossible or out-of-range times raise ``ApiError``."""
    if not isinstance(value, str) or len(value) > MAX_DATETIME_TEXT:
        raise ApiError(400, "invalid_schedule", "due_at must be an ISO-8601 date-time string with an offset.")
    if validation.text_problem(value):
        raise ApiError(400, "invalid_schedule", "due_at must be an ISO-8601 date-time string with an offset.")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise ApiError(400, "invalid_schedule", f"due_at {value!r} is not a valid ISO-8601 date-time: {exc}.") from None
    try:
        return validation.check_due_at(parsed)
    except exceptions.InvalidSchedule as exc:
        raise from_scheduling_error(exc) from None


def _time_arguments(data: dict[str, Any]) -> dict[str, Any]:
    """``due_at`` (parsed, not in the past) and/or ``delay`` as given; ``scheduling.api`` judges the combination."""
    out: dict[str, Any] = {}
    if data.get("due_at") is not None:
        out["due_at"] = parse_due_at(data["due_at"])
        _refuse_past(out["due_at"])
    if data.get("delay") is not None:
        out["delay"] = data["delay"]
    return out


def _refuse_past(due_at: dt.datetime) -> None:
    """400 ``due_at_in_past`` for a due time older than the clock-skew tolerance (``validation.check_not_past``)."""
    try:
        validation.check_not_past(due_at)
    except exceptions.DueAtInPast as exc:
        raise ApiError(400, "due_at_in_past", str(exc), field="due_at") from None


# --- Output -----------------------------------------------------------------------------------------


def job_json(job: ScheduledJob, *, attempts: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": job.id,
        "url": reverse("jobs-api:detail", args=[job.id]),
        "kind": job.kind,
        "key": job.key,
        "state": job.state,
        "due_at": job.due_at,
        "payload": job.payload,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "last_error": job.last_error,
        "owner": job.owner_id,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "finished_at": job.finished_at,
    }
    if attempts:
        out["attempt_history"] = [
            {
                "number": a.number,
                "outcome": a.outcome,
                "due_at": a.due_at,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
                "worker": a.worker,
                "error": a.error,
            }
            for a in job.attempt_set.order_by("number")
        ]
    return out


def ok(body: dict[str, Any], status: int = 200, **headers: str) -> JsonResponse:
    response = JsonResponse(body, status=status, encoder=DjangoJSONEncoder)
    for name, value in headers.items():
        response[name] = value
    return response


# --- The views --------------------------------------------------------------------------------------


def _endpoint(allowed: tuple[str, ...]) -> Any:
    """Method check (405), authentication (401), CSRF for session writes (403), ``ApiError`` answers."""

    def wrap(view: Any) -> Any:
        @csrf_exempt  # checked below for session callers only; token callers need none
        def handle(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            allow = ", ".join(allowed)
            if request.method not in allowed:
                return error_response(
                    ApiError(405, "method_not_allowed", f"{request.method} is not allowed here; use {allow}."),
                    {"Allow": allow},
                )
            caller = auth.identify(request)
            if caller.user is None:
                return error_response(
                    ApiError(401, "unauthenticated", caller.problem),
                    {"WWW-Authenticate": 'Bearer realm="timekeeper"'},
                )
            if not caller.by_token and request.method not in {"GET", "HEAD", "OPTIONS"}:
                problem = auth.csrf_problem(request)
                if problem:
                    return error_response(ApiError(403, "csrf_failed", f"CSRF check failed: {problem}"))
            try:
                with audit.acting(audit.Actor(door=AuditDoor.API, user=caller.user)):
                    return view(request, caller.user, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc, exc.headers)
            except Exception as exc:
                # A bug. Django would log the exception with its message, which may quote the body.
                _log_failure(view.__name__, request, kwargs.get("job_id"), exc)
                return error_response(ApiError(500, "internal_error", "Internal error; it has been logged."))

        handle.__name__ = view.__name__
        handle.__doc__ = view.__doc__
        return handle

    return wrap


def _log_failure(operation: str, request: HttpRequest, job_id: int | None, exc: BaseException) -> None:
    """One error line for a 500: operation, method, job id and caller, and the scrubbed traceback."""
    logger.error(
        "jobs API %s %s failed with %s (job %s)\n%s",
        request.method,
        operation,
        type(exc).__name__,
        job_id if job_id is not None else "-",
        executor.scrubbed_traceback(exc),
        extra={"job_id": job_id, "action": "api_error", "operation": operation},
    )


def visible_row(model: Any, noun: str, user: Any, pk: int, *, change: bool = False) -> Any:
    """The ``model`` row ``pk`` if ``user`` may see it (404 otherwise); with ``change``, 403 unless they may change it.

    One rule for every owned row the API serves (jobs, recurrences): the model's ``for_owner``
    queryset decides what a user sees; changing another owner's row needs the model's change
    permission. Ids past bigint are a 404, not a database error.
    """
    if pk > validation.MAX_ROW_ID:
        raise ApiError(404, "not_found", f"No such {noun}.")
    row = model.objects.for_owner(user).filter(pk=pk).first()
    if row is None:
        raise ApiError(404, "not_found", f"No such {noun}.")
    if change and row.owner_id != user.pk and not user.has_perm(f"scheduling.change_{model._meta.model_name}"):
        raise ApiError(403, "forbidden", f"You may see this {noun} but not change it.")
    return row


def _visible(user: Any, job_id: int, *, change: bool = False) -> ScheduledJob:
    """The job if ``user`` may see it (404 otherwise); with ``change``, 403 unless they may also change it."""
    job: ScheduledJob = visible_row(ScheduledJob, "job", user, job_id, change=change)
    return job


@_endpoint(("GET", "HEAD", "POST"))
def collection(request: HttpRequest, user: Any) -> JsonResponse:
    """GET: the caller's jobs (filters state, kind, key; cursor or page, page_size). POST: schedule a job."""
    if request.method == "POST":
        return _create(request, user)
    return _list(request, user)


def _list(request: HttpRequest, user: Any) -> JsonResponse:
    params = request.GET
    unknown = sorted(set(params) - LIST_PARAMETERS)
    if unknown:
        raise ApiError(400, "unknown_parameter", f"Unknown query parameter(s): {', '.join(unknown)}.")
    jobs = ScheduledJob.objects.for_owner(user)
    if "state" in params:
        states = params["state"].split(",")
        bad = [s for s in states if s not in JobState.values]
        if bad:
            raise ApiError(
                400, "invalid_filter", f"Unknown state(s) {', '.join(bad)}; use {', '.join(JobState.values)}."
            )
        jobs = jobs.in_states(states)
    for name in ("kind", "key"):
        if name in params:
            problem = validation.text_problem(params[name])
            if problem:
                raise ApiError(400, "invalid_filter", f"{name} {problem}.")
            jobs = jobs.filter(**{name: params[name]})
    return ok(paging.page(request.path, params, jobs, LIST_ORDER, job_json))


def _positive_int(text: str, name: str, maximum: int) -> int:
    # isdigit() accepts "²" and other digits int() refuses: ASCII decimal digits only.
    if not (text.isascii() and text.isdecimal()) or len(text) > 12 or not 1 <= int(text) <= maximum:
        raise ApiError(400, "invalid_parameter", f"{name} must be a whole number from 1 to {maximum}.")
    return int(text)


def requested_kind(name: Any, user: Any) -> registry.Kind:
    """The kind a request names, if ``user`` may use it: 400 when it is missing or not text, else ``_usable_kind``.

    Every door that takes a kind from a caller (jobs, recurrences) asks here, before the payload.
    """
    if not isinstance(name, str):
        raise ApiError(400, "invalid_request", "kind is required: the name of a registered job kind.")
    try:  # a name PostgreSQL could not store is no kind's: saying so tells nothing about which exist
        validation.check_text(name, "kind")
    except exceptions.InvalidSchedule as exc:
        raise from_scheduling_error(exc) from None
    return _usable_kind(user, name)


def _usable_kind(user: Any, name: str) -> registry.Kind:
    """The kind ``name`` if ``user`` may schedule it at all; else one 403 for unknown and closed kinds alike.

    Judged before the payload is read, so neither the answer nor the schema's messages tell a
    caller which kinds exist beyond those open to them.
    """
    try:
        kind = registry.get(name)
    except exceptions.UnknownJobKind:
        kind = None
    if kind is None or not kind.usable_by(user):
        raise ApiError(
            403,
            "kind_not_allowed",
            f"You may not schedule jobs of kind {name[:200]!r}: no kind of that name is open to you.",
            kind=name[:200],
        )
    return kind


def _creation_error(exc: exceptions.OverCreationLimit) -> ApiError:
    """429 with ``Retry-After`` for the create rate or the pending quota."""
    extra: dict[str, Any] = {"retry_after": exc.retry_after}
    if exc.limit is not None:
        extra["limit"] = exc.limit
    return ApiError(429, exc.code, str(exc), headers={"Retry-After": str(exc.retry_after)}, **extra)


def _take_create_allowance(user: Any) -> None:
    """429 with ``Retry-After`` when ``user`` is creating faster than the rate (superusers are exempt)."""
    try:
        validation.take_create_allowance(user)
    except exceptions.OverCreationLimit as exc:
        raise _creation_error(exc) from None


def _create(request: HttpRequest, user: Any) -> JsonResponse:
    _take_create_allowance(user)
    data = read_json(request)
    _check_fields(data, CREATE_FIELDS)
    kind = requested_kind(data.get("kind"), user)
    payload = data.get("payload", {})
    priority = data.get("priority")
    if priority is not None and not registry.is_priority(priority):
        raise ApiError(
            400,
            "invalid_priority",
            f"priority must be a whole number from {registry.MIN_PRIORITY} to {registry.MAX_PRIORITY} "
            "(higher is claimed first), "
            f"got {json.dumps(priority)[:40]}.",
        )
    try:
        validation.encode_payload(kind, payload)
        validation.check_access(kind, user, payload)
        validation.check_caller_limits(kind, user, max_attempts=data.get("max_attempts"), priority=priority)
        times = _time_arguments(data)
        with transaction.atomic():
            validation.lock_creations(user)
            job, outcome = api.schedule_with_outcome(
                data["kind"],
                payload,
                key=data.get("key"),
                on_conflict=data.get("on_conflict", "replace"),
                max_attempts=data.get("max_attempts"),
                owner=user,
                priority=priority,
                unique_for=data.get("unique_for"),
                unique_states=data.get("unique_states"),
                **times,
            )
            if outcome == "created":
                validation.check_quota(user, job.pk)  # raising here rolls the new job back
    except exceptions.SchedulingError as exc:
        raise from_scheduling_error(exc) from None
    stored = ScheduledJob.objects.get(pk=job.pk)
    job_body = job_json(stored)
    body = {"outcome": outcome, "job": job_body}
    if outcome == "created":
        return ok(body, status=201, Location=job_body["url"])
    return ok(body)


@_endpoint(("GET", "HEAD"))
def detail(request: HttpRequest, user: Any, job_id: int) -> JsonResponse:
    """One job with its attempts."""
    return ok(job_json(_visible(user, job_id), attempts=True))


@_endpoint(("POST",))
def cancel(request: HttpRequest, user: Any, job_id: int) -> JsonResponse:
    """Cancel a pending job (409 names the state otherwise)."""
    data = read_json(request, optional=True)
    _check_fields(data, frozenset())
    _visible(user, job_id, change=True)
    try:
        with transaction.atomic():
            api.cancel(job_id)
    except exceptions.SchedulingError as exc:
        raise from_scheduling_error(exc) from None
    return ok(job_json(_visible(user, job_id)))


@_endpoint(("POST",))
def abort(request: HttpRequest, user: Any, job_id: int) -> JsonResponse:
    """Abort a claimed or running job (``api.abort``): 202 while its worker stops it, 200 when cancelled now.

    409 when it finished before the abort arrived (it stays finished) or is pending (cancel it).
    """
    data = read_json(request, optional=True)
    _check_fields(data, frozenset())
    _visible(user, job_id, change=True)
    try:
        with transaction.atomic():
            aborted = api.abort(job_id)
    except exceptions.SchedulingError as exc:
        raise from_scheduling_error(exc) from None
    body = {**job_json(_visible(user, job_id)), "abort": aborted.outcome}
    return ok(body, status=202 if aborted.requested else 200)


@_endpoint(("POST",))
def reschedule(request: HttpRequest, user: Any, job_id: int) -> JsonResponse:
    """Move a pending job: ``{"due_at": ISO-8601}`` or ``{"delay": seconds}``."""
    data = read_json(request)
    _check_fields(data, RESCHEDULE_FIELDS)
    times = _time_arguments(data)
    _visible(user, job_id, change=True)
    try:
        with transaction.atomic():
            api.reschedule(job_id, **times)
    except exceptions.SchedulingError as exc:
        raise from_scheduling_error(exc) from None
    return ok(job_json(_visible(user, job_id)))
