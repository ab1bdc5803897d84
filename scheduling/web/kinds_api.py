"""The kinds JSON API: ``GET /api/kinds/``, ``POST /api/kinds/<kind>/pause``, ``.../resume``, ``.../<verb>``
(each per-kind option of ``core/kind_options.py``), ``.../rate``.

Operators' controls over whole kinds, through ``scheduling.api`` (``pause``, ``resume``,
``set_kind_option``, ``kind_overview``). Each per-kind option of ``core/kind_options.py`` has its
endpoint, named by its verb (``POST /api/kinds/<kind>/cap`` with ``{"max_running": n}``, n from 1 to
1,000,000, or ``null`` for no cap), made here by ``setter(option)``. The rate limit (N per period,
optionally per payload field) is not a scalar option and keeps its own endpoint: ``POST
/api/kinds/<kind>/rate`` with ``{"rate": "10/s", "partition_by": "partner"}`` or ``{"rate": null}``.
Every endpoint takes a staff account with the ``scheduling.change_kindcontrol`` permission (a
session with CSRF, or a bearer token): others get 403 with the reason. 400: a wrong body
(``invalid_<noun>`` for a value out of bounds); 404: no registered kind of that name; 405: wrong method.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from scheduling import api
from scheduling.core import exceptions, kind_options, registry
from scheduling.web import jobs_api

PERMISSION = "scheduling.change_kindcontrol"
RATE_FIELDS = frozenset({"rate", "partition_by"})


def _operator(user: Any) -> None:
    """403 unless ``user`` is staff with the kind-control permission."""
    if not user.is_staff:
        raise jobs_api.ApiError(403, "forbidden", "Kind controls are for staff accounts.")
    if not user.has_perm(PERMISSION):
        raise jobs_api.ApiError(403, "forbidden", f"Kind controls need the {PERMISSION} permission.")


def _known(kind: str) -> None:
    try:
        registry.get(kind)
    except exceptions.UnknownJobKind:
        raise jobs_api.ApiError(404, "unknown_kind", f"No registered kind {kind!r}.") from None


def _overview(kind: str) -> dict[str, Any]:
    return next(k.as_json() for k in api.kind_overview() if k.kind == kind)


@jobs_api._endpoint(("GET", "HEAD"))
def collection(request: HttpRequest, user: Any) -> JsonResponse:
    """Every kind with its controls (paused, max_running) and counts (due, claimed, running, dead_24h)."""
    _operator(user)
    return jobs_api.ok({"results": [k.as_json() for k in api.kind_overview()]})


@jobs_api._endpoint(("POST",))
def pause(request: HttpRequest, user: Any, kind: str) -> JsonResponse:
    """Pause a kind: its due jobs stay pending until resumed."""
    _operator(user)
    jobs_api._check_fields(jobs_api.read_json(request, optional=True), frozenset())
    _known(kind)
    with transaction.atomic():
        api.pause(kind)
    return jobs_api.ok(_overview(kind))


@jobs_api._endpoint(("POST",))
def resume(request: HttpRequest, user: Any, kind: str) -> JsonResponse:
    """Resume a kind: its due jobs are claimed again."""
    _operator(user)
    jobs_api._check_fields(jobs_api.read_json(request, optional=True), frozenset())
    try:  # api.resume knows which kinds can be resumed (registered, or still holding a control)
        with transaction.atomic():
            api.resume(kind)
    except exceptions.UnknownJobKind:
        raise jobs_api.ApiError(404, "unknown_kind", f"No registered kind {kind!r}.") from None
    return jobs_api.ok(_overview(kind))


def setter(option: kind_options.KindOption) -> Any:
    """The endpoint that sets ``option``: ``POST /api/kinds/<kind>/<verb>`` with ``{"<name>": value}`` (null unsets)."""
    fields = frozenset({option.name})

    def set_option(request: HttpRequest, user: Any, kind: str) -> JsonResponse:
        _operator(user)
        data = jobs_api.read_json(request)
        jobs_api._check_fields(data, fields)
        if option.name not in data:
            raise jobs_api.ApiError(
                400,
                "invalid_request",
                f'Send {{"{option.name}": n}} ({kind_options.plain(option.minimum)} to '
                f"{kind_options.plain(option.maximum)}) or null for {option.unset}.",
            )
        try:  # api.set_kind_option knows which kinds can take or lose the option
            with transaction.atomic():
                api.set_kind_option(kind, option.name, data[option.name])
        except exceptions.UnknownJobKind:
            raise jobs_api.ApiError(404, "unknown_kind", f"No registered kind {kind!r}.") from None
        except exceptions.InvalidSchedule as exc:
            raise jobs_api.ApiError(400, f"invalid_{option.noun}", str(exc)) from None
        return jobs_api.ok(_overview(kind))

    set_option.__name__ = set_option.__qualname__ = option.verb
    set_option.__doc__ = option.summary
    return jobs_api._endpoint(("POST",))(set_option)


SETTERS = {option.verb: setter(option) for option in kind_options.KIND_OPTIONS}  # {verb: endpoint}


@jobs_api._endpoint(("POST",))
def rate(request: HttpRequest, user: Any, kind: str) -> JsonResponse:
    """Limit a kind's starts: ``{"rate": "10/s", "partition_by": "partner"}``, or ``{"rate": null}`` for none."""
    _operator(user)
    data = jobs_api.read_json(request)
    jobs_api._check_fields(data, RATE_FIELDS)
    if "rate" not in data or not (data["rate"] is None or isinstance(data["rate"], str)):
        raise jobs_api.ApiError(400, "invalid_request", 'Send {"rate": "10/s"} (optionally "partition_by") or null.')
    partition_by = data.get("partition_by", "")
    if partition_by is None:
        partition_by = ""
    if not isinstance(partition_by, str):
        raise jobs_api.ApiError(400, "invalid_rate", "partition_by must be a payload field name.")
    try:  # api.set_rate knows which kinds can be limited or lifted
        given = None if data["rate"] is None else registry.Rate.parse(data["rate"], partition_by)
        with transaction.atomic():
            api.set_rate(kind, given)
    except exceptions.UnknownJobKind:
        raise jobs_api.ApiError(404, "unknown_kind", f"No registered kind {kind!r}.") from None
    except exceptions.SchedulingError as exc:
        raise jobs_api.ApiError(400, "invalid_rate", str(exc)) from None
    return jobs_api.ok(_overview(kind))
