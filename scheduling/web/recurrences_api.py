"""The recurrences JSON API: ``/api/recurrences/`` (list, create) and one recurrence's verbs.

``GET/POST /api/recurrences/``, ``GET/PATCH /api/recurrences/<id>``, ``POST .../pause``,
``.../resume``, ``.../cancel``, ``GET .../next?n=5``. Plain views over ``scheduling.api``, with the
jobs API's rules (``scheduling/web/jobs_api.py``): authentication, CSRF for session writes, the
same error bodies and status codes. Rows belong to their owner (another caller gets 404); seeing
everyone's takes ``scheduling.view_recurrence``; with ``scheduling.change_recurrence`` staff may
pause, resume and cancel another owner's recurrence, never rewrite it (PATCH is the owner's
alone: its occurrences run as the owner). Keys are per owner.

The jobs API's door, the same code: the create rate (429 ``rate_limited``, taken before the body
is read), one 403 ``kind_not_allowed`` for an unknown kind, a closed one and one the caller may not
use, judged before the payload (``jobs_api.requested_kind``), then the kind's ``Access`` predicate
on the payload, at create and at every change. ``scheduling.api.recur(caller=...)`` adds the
caller limits on attempts and priority (400 ``over_limit``), the minimum interval for ``every`` and
cron (400 ``too_frequent``), the recurrence quota (429 ``recurrence_quota_exceeded``) and the
pending quota counting the first occurrence (429 ``quota_exceeded``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import reverse

from scheduling import api
from scheduling.core import exceptions, registry, validation
from scheduling.models import Recurrence, RecurrenceState
from scheduling.recurring import api as recurring_api
from scheduling.web import jobs_api, paging
from scheduling.web.jobs_api import ApiError

RULE_FIELDS = frozenset(
    {"payload", "cron", "every", "timezone", "starts_at", "ends_at", "dst_gap", "missed", "priority", "max_attempts"}
)
CREATE_FIELDS = RULE_FIELDS | {"kind", "key", "on_conflict"}
CHANGE_FIELDS = RULE_FIELDS | {"kind"}
LIST_PARAMETERS = frozenset({"state", "kind", "key", "timezone", "page", "page_size", "cursor"})
LIST_ORDER = ("id",)
MAX_EVERY_SECONDS = validation.MAX_DELAY_SECONDS  # ten years: a longer interval is a unit mistake
DEFAULT_NEXT = 10  # GET .../next without ?n=
DETAIL_NEXT = 5  # the next occurrences in a recurrence's own answers (not in the list)


def recurrence_json(recurrence: Recurrence, *, upcoming: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": recurrence.id,
        "url": reverse("recurrences-api:detail", args=[recurrence.id]),
        "kind": recurrence.kind,
        "key": recurrence.key,
        "state": recurrence.state,
        "cron": recurrence.expression or None,
        "every": recurrence.every_seconds,
        "timezone": recurrence.timezone,
        "dst_gap": recurrence.dst_gap,
        "missed": recurrence.missed,
        "starts_at": recurrence.starts_at,
        "ends_at": recurrence.ends_at,
        "payload": recurrence.payload,
        "priority": recurrence.priority,
        "max_attempts": recurrence.max_attempts,
        "occurrence_at": recurrence.current_at,
        "occurrence_job": recurrence.current_job_id,
        "owner": recurrence.owner_id,
        "paused_reason": recurrence.paused_reason,
        "created_at": recurrence.created_at,
        "updated_at": recurrence.updated_at,
    }
    if upcoming:
        out["next_occurrences"] = api.next_occurrences(recurrence.id, n=upcoming)
    return out


def _visible(user: Any, recurrence_id: int, *, change: bool = False) -> Recurrence:
    recurrence: Recurrence = jobs_api.visible_row(Recurrence, "recurrence", user, recurrence_id, change=change)
    return recurrence


def _error(exc: exceptions.SchedulingError) -> ApiError:
    if isinstance(exc, exceptions.RecurrenceNotFound):
        return ApiError(404, "not_found", "No such recurrence.")
    if isinstance(exc, exceptions.RecurrenceKeyConflict):
        return ApiError(409, "key_conflict", str(exc), key=exc.key, recurrence_id=exc.recurrence_id)
    if isinstance(exc, exceptions.RecurrenceStateConflict):
        return ApiError(409, "state_conflict", str(exc), recurrence_id=exc.recurrence_id, state=exc.state)
    if isinstance(exc, exceptions.InvalidCronExpression | exceptions.UnknownTimeZone | exceptions.InvalidPolicy):
        return ApiError(400, "invalid_schedule", str(exc))
    if isinstance(exc, exceptions.RecurrenceTooFrequent):
        return ApiError(400, "too_frequent", str(exc), field=exc.field, limit=exc.limit)
    return jobs_api.from_scheduling_error(exc)


def _datetime(data: dict[str, Any], name: str) -> dt.datetime | None:
    """``starts_at`` or ``ends_at``: ISO-8601 with an offset, within the jobs' window (2000-01-01 to ten years ahead).

    The window keeps every computed occurrence (at most ``MAX_PREVIEW`` intervals of at most ten
    years past it) inside what a datetime can hold.
    """
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > jobs_api.MAX_DATETIME_TEXT or validation.text_problem(value):
        raise ApiError(400, "invalid_schedule", f"{name} must be an ISO-8601 date-time string with an offset.")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ApiError(400, "invalid_schedule", f"{name} {value!r} is not a valid ISO-8601 date-time.") from None
    if parsed.utcoffset() is None:
        raise ApiError(400, "invalid_schedule", f"{name} must have a UTC offset (a naive time is ambiguous).")
    try:
        return validation.check_due_at(parsed)
    except (exceptions.InvalidSchedule, OverflowError, ValueError):
        raise ApiError(
            400,
            "invalid_schedule",
            f"{name} must be from {validation.EARLIEST_DUE_AT:%Y-%m-%d} to ten years ahead, with a UTC offset in "
            f"whole minutes within ±15:59; got {value!r}.",
            field=name,
        ) from None


def _rule_arguments(data: dict[str, Any]) -> dict[str, Any]:
    """The rule fields given in the body, parsed (each type checked; the API checks the values)."""
    out: dict[str, Any] = {}
    for name in ("cron", "timezone", "dst_gap", "missed"):
        if name in data:
            value = data[name]
            if value is not None and (not isinstance(value, str) or validation.text_problem(value)):
                raise ApiError(400, "invalid_schedule", f"{name} must be a string.")
            out[name] = value
    if "every" in data:
        every = data["every"]
        if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)):
            raise ApiError(400, "invalid_schedule", "every must be a number of seconds.")
        if every is not None and every > MAX_EVERY_SECONDS:
            raise ApiError(400, "invalid_schedule", f"every must be at most {MAX_EVERY_SECONDS} seconds (ten years).")
        out["every"] = every
    for name in ("starts_at", "ends_at"):
        if name in data:
            out[name] = _datetime(data, name)
    for name in ("priority", "max_attempts"):
        if name in data:
            out[name] = data[name]
    if "payload" in data:
        out["payload"] = data["payload"]
    return out


@jobs_api._endpoint(("GET", "HEAD", "POST"))
def collection(request: HttpRequest, user: Any) -> JsonResponse:
    """GET: the caller's recurrences (filters state, kind, key, timezone; cursor or page, page_size). POST: recur."""
    if request.method == "POST":
        return _create(request, user)
    params = request.GET
    unknown = sorted(set(params) - LIST_PARAMETERS)
    if unknown:
        raise ApiError(400, "unknown_parameter", f"Unknown query parameter(s): {', '.join(unknown)}.")
    rows = Recurrence.objects.for_owner(user)
    if "state" in params:
        states = params["state"].split(",")
        bad = [s for s in states if s not in RecurrenceState.values]
        if bad:
            raise ApiError(400, "invalid_filter", f"Unknown state(s) {', '.join(bad)}.")
        rows = rows.filter(state__in=states)
    for name in ("kind", "key", "timezone"):
        if name in params:
            problem = validation.text_problem(params[name])
            if problem:
                raise ApiError(400, "invalid_filter", f"{name} {problem}.")
            rows = rows.filter(**{name: params[name]})
    return jobs_api.ok(paging.page(request.path, params, rows, LIST_ORDER, recurrence_json))


def _check_payload(kind: registry.Kind, user: Any, payload: Any) -> None:
    """A payload for a kind the caller may use (``jobs_api.requested_kind``): its schema, then the predicate."""
    validation.encode_payload(kind, payload)
    validation.check_access(kind, user, payload)


def _create(request: HttpRequest, user: Any) -> JsonResponse:
    jobs_api._take_create_allowance(user)
    data = jobs_api.read_json(request)
    jobs_api._check_fields(data, CREATE_FIELDS)
    kind = jobs_api.requested_kind(data.get("kind"), user)
    if not isinstance(data.get("key"), str):
        raise ApiError(400, "invalid_request", "key is required: it names the recurrence (unique per owner).")
    arguments = _rule_arguments(data)
    payload = arguments.pop("payload", {})
    try:
        _check_payload(kind, user, payload)
        existed = _exists(data["key"], user)
        with transaction.atomic():
            recurrence = api.recur(
                kind.name,
                payload,
                key=data["key"],
                owner=user,
                on_conflict=data.get("on_conflict", "replace"),
                caller=user,
                **arguments,
            )
    except exceptions.SchedulingError as exc:
        raise _error(exc) from None
    outcome = "kept" if existed and data.get("on_conflict") == "keep" else "replaced" if existed else "created"
    shown = recurrence_json(recurrence, upcoming=DETAIL_NEXT)
    body = {"outcome": outcome, "recurrence": shown}
    if not existed:
        return jobs_api.ok(body, status=201, Location=shown["url"])
    return jobs_api.ok(body)


def _exists(key: str, user: Any) -> bool:
    validation.check_key(key)
    return Recurrence.objects.filter(owner_id=user.pk, key=key).exists()


@jobs_api._endpoint(("GET", "HEAD", "PATCH"))
def detail(request: HttpRequest, user: Any, recurrence_id: int) -> JsonResponse:
    """GET: one recurrence with its next occurrences. PATCH: change its rule, zone, payload or policies."""
    if request.method != "PATCH":
        return jobs_api.ok(recurrence_json(_visible(user, recurrence_id), upcoming=DETAIL_NEXT))
    data = jobs_api.read_json(request)
    jobs_api._check_fields(data, CHANGE_FIELDS)
    recurrence = _visible(user, recurrence_id, change=True)
    if recurrence.owner_id != user.pk:
        raise ApiError(
            403,
            "forbidden",
            "Another owner's recurrence may be paused, resumed or cancelled, not changed: its occurrences run as "
            "its owner.",
        )
    kind = jobs_api.requested_kind(data.get("kind", recurrence.kind), user)
    arguments = _rule_arguments(data)
    if "kind" in data:
        arguments["kind"] = kind.name
    try:
        if "kind" in arguments or "payload" in arguments:
            _check_payload(kind, user, arguments.get("payload", recurrence.payload))
        with transaction.atomic():
            changed = api.change_recurrence(recurrence_id, caller=user, **arguments)
    except exceptions.SchedulingError as exc:
        raise _error(exc) from None
    return jobs_api.ok(recurrence_json(changed, upcoming=DETAIL_NEXT))


def _verb(call: Any, *, creates: bool = False, name: str = "") -> Any:
    """A state change by id; ``creates``: it plans an occurrence (a new job of the caller's), so it
    spends the create rate and counts against the pending-jobs quota as a create does."""

    def view(request: HttpRequest, user: Any, recurrence_id: int) -> JsonResponse:
        data = jobs_api.read_json(request, optional=True)
        jobs_api._check_fields(data, frozenset())
        _visible(user, recurrence_id, change=True)
        if creates:
            jobs_api._take_create_allowance(user)
        try:
            with transaction.atomic():
                created = call(recurrence_id, caller=user) if creates else call(recurrence_id)
        except exceptions.SchedulingError as exc:
            raise _error(exc) from None
        if creates and not created:
            # Already active: nothing was planned, so the creation charged above is given back (a
            # refused or failed request keeps its charge: every create request counts).
            validation.give_back_create_allowance(user)
        return jobs_api.ok(recurrence_json(_visible(user, recurrence_id), upcoming=DETAIL_NEXT))

    view.__name__ = name or call.__name__
    return jobs_api._endpoint(("POST",))(view)


pause = _verb(api.pause_recurrence)
resume = _verb(recurring_api.resume_recurrence_planning, creates=True, name="resume_recurrence")
cancel = _verb(api.cancel_recurrence)


@jobs_api._endpoint(("GET", "HEAD"))
def upcoming(request: HttpRequest, user: Any, recurrence_id: int) -> JsonResponse:
    """The next ``n`` occurrence instants (``?n=``, 1-100, default 10)."""
    n = jobs_api._positive_int(request.GET.get("n", str(DEFAULT_NEXT)), "n", recurring_api.MAX_PREVIEW)
    _visible(user, recurrence_id)
    try:
        instants = api.next_occurrences(recurrence_id, n=n)
    except exceptions.SchedulingError as exc:
        raise _error(exc) from None
    return jobs_api.ok({"id": recurrence_id, "next_occurrences": instants})
