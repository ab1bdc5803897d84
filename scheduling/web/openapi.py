"""The OpenAPI 3 document of all of ``/api/`` (jobs, kinds, recurrences), served at ``/api/jobs/openapi.json``.

One document, served without authentication. Built in Python from the same constants the views
check (fields, states, page sizes, id pattern), so the document and the views cannot drift apart on
them; the recurrences' part is ``openapi_recurrences.py``, the shared error answers
``openapi_parts.py``. It describes shapes only: no kind users or jobs (its examples name a kind any
signed-in user may schedule), which is why it is public: tools fetch it before they hold a token.
``tests/integration/web/test_jobs_api_openapi.py`` validates it with openapi-spec-validator, and
``tests/integration/web/test_jobs_api_fuzz.py`` fuzzes a real server with schemathesis against it.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from scheduling.core import exceptions, kind_options, options, registry, validation
from scheduling.due_at import api as jobs_api_functions
from scheduling.models import AttemptOutcome, JobState
from scheduling.web import jobs_api, kinds_api, openapi_parts, openapi_recurrences

JSON = openapi_parts.JSON
_ref = openapi_parts.ref
_error = openapi_parts.error
_ERRORS = openapi_parts.ERRORS


def _responses(ok: dict[str, Any], *codes: str) -> dict[str, Any]:
    return openapi_parts.responses(ok, *codes)


def _job_response(description: str) -> dict[str, Any]:
    return {"200": {"description": description, "content": {JSON: {"schema": _ref("Job")}}}}


_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "description": "The job's id: digits only, at most 20 of them.",
    "schema": {"type": "string", "pattern": "^[0-9]{1,20}$"},
}

_DUE_AT = {
    "type": "string",
    "format": "date-time",
    "maxLength": jobs_api.MAX_DATETIME_TEXT,
    "description": (
        "ISO-8601 with a UTC offset (whole minutes within ±15:59), up to ten years ahead; not in the past "
        "(SCHEDULING_API_PAST_DUE_TOLERANCE_SECONDS of clock skew aside: older is a 400 `due_at_in_past`)."
    ),
}
_DELAY = {
    "type": "number",
    "minimum": 0,
    "maximum": validation.MAX_DELAY_SECONDS,
    "description": "Seconds from now, by the database clock.",
}

_LINKS = {
    "GetJob": {"operationId": "getJob", "parameters": {"job_id": "$response.body#/job/id"}},
    "CancelJob": {"operationId": "cancelJob", "parameters": {"job_id": "$response.body#/job/id"}},
    "RescheduleJob": {"operationId": "rescheduleJob", "parameters": {"job_id": "$response.body#/job/id"}},
}


def _schemas() -> dict[str, Any]:
    timestamp = {"type": "string", "format": "date-time"}
    nullable_timestamp = {"type": "string", "format": "date-time", "nullable": True}
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["status", "code", "message"],
                    "properties": {
                        "status": {"type": "integer"},
                        "code": {
                            "type": "string",
                            "description": (
                                "Stable: kind_not_allowed, invalid_payload, invalid_schedule, over_limit, "
                                "due_at_in_past, rate_limited, quota_exceeded, ..."
                            ),
                        },
                        "message": {"type": "string"},
                        "field": {"type": "string", "description": "over_limit, due_at_in_past: the field at fault."},
                        "limit": {"description": "over_limit, quota_exceeded: the most the caller may ask."},
                        "retry_after": {"type": "integer", "description": "429: seconds, as in Retry-After."},
                    },
                    "additionalProperties": True,
                }
            },
        },
        "Attempt": {
            "type": "object",
            "required": ["number", "outcome", "due_at", "started_at", "finished_at", "worker", "error"],
            "properties": {
                "number": {"type": "integer"},
                "outcome": {"type": "string", "enum": list(AttemptOutcome.values)},
                "due_at": timestamp,
                "started_at": timestamp,
                "finished_at": timestamp,
                "worker": {"type": "string"},
                "error": {"type": "string"},
            },
        },
        "AbortedJob": {
            "allOf": [
                _ref("Job"),
                {
                    "type": "object",
                    "required": ["abort"],
                    "properties": {
                        "abort": {
                            "type": "string",
                            "enum": ["requested", "cancelled"],
                            "description": "requested: running, its worker stops it; cancelled: it never started.",
                        }
                    },
                },
            ]
        },
        "Job": {
            "type": "object",
            "required": [
                "id",
                "url",
                "kind",
                "key",
                "state",
                "due_at",
                "payload",
                "attempts",
                "max_attempts",
                "priority",
                "last_error",
                "owner",
                "created_at",
                "updated_at",
                "finished_at",
            ],
            "properties": {
                "id": {"type": "integer"},
                "url": {"type": "string"},
                "kind": {"type": "string"},
                "key": {"type": "string", "nullable": True},
                "state": {"type": "string", "enum": list(JobState.values)},
                "due_at": timestamp,
                "payload": {"type": "object", "additionalProperties": True},
                "attempts": {"type": "integer"},
                "max_attempts": {"type": "integer"},
                "priority": {"type": "integer"},
                "last_error": {"type": "string"},
                "owner": {"type": "integer", "nullable": True},
                "created_at": timestamp,
                "updated_at": timestamp,
                "finished_at": nullable_timestamp,
                "attempt_history": {
                    "type": "array",
                    "items": _ref("Attempt"),
                    "description": "Only in the answer of GET /api/jobs/{job_id}.",
                },
            },
        },
        "JobPage": openapi_parts.page_schema("Job", "The caller's jobs by (due_at, id)."),
        "CreateJob": {
            "type": "object",
            "required": ["kind"],
            "additionalProperties": False,
            "description": "Give exactly one of due_at and delay.",
            "properties": {
                "kind": {"type": "string", "description": "A registered kind the caller may schedule."},
                "payload": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "Checked against the kind's JSON Schema; at most SCHEDULING_MAX_PAYLOAD_BYTES.",
                },
                "due_at": {**_DUE_AT, "nullable": True},
                "delay": {**_DELAY, "nullable": True},
                "key": {
                    "type": "string",
                    "nullable": True,
                    "minLength": 1,
                    "maxLength": validation.MAX_KEY_LENGTH,
                    "description": "One job waiting to run per (caller, key); a running one does not count.",
                },
                "on_conflict": {"type": "string", "enum": list(jobs_api_functions.ON_CONFLICT_CHOICES)},
                "unique_for": {
                    "type": "number",
                    "nullable": True,
                    "minimum": 0,
                    "maximum": options.MAX_UNIQUE_FOR_SECONDS,
                    "description": (
                        "A uniqueness window in seconds (default: the kind's; 0: none): a job of the kind with the "
                        "same key, or without a key the same payload, scheduled by the caller in the same window "
                        "slot while that job is in one of unique_states meets on_conflict (409 `duplicate_job` "
                        "for error)."
                    ),
                },
                "unique_states": {
                    "type": "array",
                    "nullable": True,
                    "items": {"type": "string", "enum": list(options.UNIQUE_STATES_CHOICES)},
                    "description": "The states that hold the window; pending, claimed and running always do.",
                },
                "max_attempts": {
                    "type": "integer",
                    "nullable": True,
                    "minimum": 1,
                    "maximum": validation.MAX_ATTEMPTS_LIMIT,
                    "description": (
                        "Default: the kind's. At most the kind's bound for callers, such that attempts x the "
                        "kind's timeout stays within SCHEDULING_API_MAX_JOB_SECONDS (400 `over_limit` otherwise)."
                    ),
                },
                "priority": {
                    "type": "integer",
                    "nullable": True,
                    "minimum": registry.MIN_PRIORITY,
                    "maximum": registry.MAX_PRIORITY,
                    "description": (
                        "Among due jobs, a higher priority is claimed first (default: the kind's). Above the "
                        f"kind's bound for callers it needs {registry.PRIORITIZE_PERMISSION} (400 `over_limit`)."
                    ),
                },
            },
        },
        "Created": {
            "type": "object",
            "required": ["outcome", "job"],
            "properties": {
                "outcome": {"type": "string", "enum": ["created", "replaced", "kept"]},
                "job": _ref("Job"),
            },
        },
        "Reschedule": {
            "type": "object",
            "additionalProperties": False,
            "description": "Exactly one of due_at and delay.",
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {"due_at": _DUE_AT, "delay": _DELAY},
        },
        "Empty": {"type": "object", "additionalProperties": False, "maxProperties": 0},
        "Kind": {
            "type": "object",
            "description": "A kind as an operator sees it: its controls and what it has due, in flight and dead.",
            "required": jobs_api_functions.KindOverview.json_names(),
            "properties": {
                "kind": {"type": "string"},
                "description": {"type": "string"},
                "paused": {"type": "boolean"},
                **{o.name: o.reading_schema() for o in kind_options.KIND_OPTIONS},
                "rate": {"type": "string", "description": 'Its rate limit ("10/s", "5/2s per partner"); "" for none.'},
                "queue": {"type": "string", "description": "Its named queue (run by workers started with -Q)."},
                "priority": {"type": "integer", "minimum": registry.MIN_PRIORITY, "maximum": registry.MAX_PRIORITY},
                "due": {"type": "integer", "description": "Pending and due (held back while paused)."},
                "claimed": {"type": "integer", "description": "Claimed, waiting for a worker."},
                "running": {"type": "integer"},
                "dead_24h": {"type": "integer"},
            },
        },
        "KindList": {
            "type": "object",
            "required": ["results"],
            "properties": {"results": {"type": "array", "items": _ref("Kind")}},
        },
        **{
            o.noun.capitalize(): {
                "type": "object",
                "additionalProperties": False,
                "required": [o.name],
                "properties": {o.name: o.json_schema()},
            }
            for o in kind_options.KIND_OPTIONS
        },
        "Rate": {
            "type": "object",
            "additionalProperties": False,
            "required": ["rate"],
            "properties": {
                "rate": {
                    "type": "string",
                    "nullable": True,
                    "pattern": r"^[0-9]+/[0-9.]*[smhd]$",
                    "description": "At most so many starts per period (a sliding window), cluster-wide: 10/s, 1/m, "
                    "100/h, 5/2s; null: none. Replaces the handler's registered rate.",
                },
                "partition_by": {
                    "type": "string",
                    "maxLength": 100,
                    "description": "A payload field: the limit holds for each of its values apart.",
                },
            },
        },
    }


def _open_kind() -> str | None:
    """The first kind (by name) that any signed-in user may schedule with ``{}``: the create example."""
    for name, kind in sorted(registry.all_kinds().items()):
        if kind.api is None or kind.api.permission is not None or kind.api.predicate is not None:
            continue
        try:
            kind.validate({})
        except exceptions.InvalidPayload:
            continue
        return name
    return None


_KIND = {"name": "kind", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
_KIND_ERRORS = {
    "403": _error(f"Not staff, or no {kinds_api.PERMISSION} permission (or a session write without CSRF)."),
    "404": _error("No registered kind of that name (lifting a control: no kind with a control either)."),
}


def _kind_responses(ok: dict[str, Any], *codes: str) -> dict[str, Any]:
    return {**ok, **{code: _KIND_ERRORS.get(code) or _ERRORS[code] for code in codes}}


def _kind_paths() -> dict[str, Any]:
    """The kinds API (``/api/kinds/``): staff with the kind-control permission pause, resume and cap kinds."""
    open_kind = _open_kind()
    kind_parameter = {**_KIND, "example": open_kind} if open_kind is not None else _KIND  # the create example's kind
    one = {"200": {"description": "The kind after the change.", "content": {JSON: {"schema": _ref("Kind")}}}}
    empty_body = {"required": False, "content": {JSON: {"schema": _ref("Empty")}}}
    every = {"description": "Every kind with its controls and counts.", "content": {JSON: {"schema": _ref("KindList")}}}
    listed = _kind_responses({"200": every}, "401", "403")
    return {
        "/api/kinds/": {
            "get": {"operationId": "listKinds", "summary": "Every kind, its controls and counts.", "responses": listed},
            "head": {
                "operationId": "headKinds",
                "responses": {code: {"description": r["description"]} for code, r in listed.items()},
            },
        },
        "/api/kinds/{kind}/pause": {
            "parameters": [kind_parameter],
            "post": {
                "operationId": "pauseKind",
                "summary": "Pause a kind: its due jobs stay pending (counted as paused) until resumed.",
                "requestBody": empty_body,
                "responses": _kind_responses(one, "400", "401", "403", "404", "413", "415"),
            },
        },
        "/api/kinds/{kind}/resume": {
            "parameters": [kind_parameter],
            "post": {
                "operationId": "resumeKind",
                "summary": "Resume a kind: its due jobs are claimed again.",
                "requestBody": empty_body,
                "responses": _kind_responses(one, "400", "401", "403", "404", "413", "415"),
            },
        },
        **{
            f"/api/kinds/{{kind}}/{o.verb}": {
                "parameters": [kind_parameter],
                "post": {
                    "operationId": f"{o.verb}Kind",
                    "summary": o.summary,
                    "requestBody": {"required": True, "content": {JSON: {"schema": _ref(o.noun.capitalize())}}},
                    "responses": _kind_responses(one, "400", "401", "403", "404", "413", "415"),
                },
            }
            for o in kind_options.KIND_OPTIONS
        },
        "/api/kinds/{kind}/rate": {
            "parameters": [kind_parameter],
            "post": {
                "operationId": "rateKind",
                "summary": "Limit how many of a kind's jobs start per period, cluster-wide (decided at the claim).",
                "requestBody": {"required": True, "content": {JSON: {"schema": _ref("Rate")}}},
                "responses": _kind_responses(one, "400", "401", "403", "404", "413", "415"),
            },
        },
    }


def document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of /api/ (paths are absolute: /api/jobs/, /api/kinds/, /api/recurrences/)."""
    list_parameters = openapi_parts.list_parameters(
        JobState.values, ("kind", "key"), jobs_api.MAX_PAGE_SIZE, jobs_api.DEFAULT_PAGE_SIZE
    )
    list_responses = _responses(
        {"200": {"description": "A page of the caller's jobs.", "content": {JSON: {"schema": _ref("JobPage")}}}},
        "400",
        "401",
        "404",
    )
    create_media: dict[str, Any] = {"schema": _ref("CreateJob")}
    example_kind = _open_kind()
    if example_kind is not None:
        create_media["example"] = {"kind": example_kind, "payload": {}, "delay": 3600}
    detail_responses = _responses(_job_response("The job with its attempts."), "401", "404")
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Timekeeper JSON API: jobs, recurrences and kinds",
            "version": "1",
            "description": (
                "Schedule, list, cancel and reschedule due_at jobs. Callers see and change only their own "
                "jobs; staff need the admin's job permissions. A session caller sends the CSRF token on writes. "
                "A method an operation does not list is answered 405 with an `Allow` header. Under /api/kinds/, "
                "staff with the kind-control permission pause, resume and cap kinds. Under /api/recurrences/, callers "
                "recur kinds they may schedule on a cron expression or an interval, and list, change, pause, resume "
                "and cancel their recurrences."
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerToken": []}, {"session": []}],
        "paths": {
            "/api/jobs/openapi.json": {
                "get": {
                    "operationId": "getOpenApi",
                    "summary": "This document.",
                    "security": [],
                    "responses": {"200": {"description": "The OpenAPI document.", "content": {JSON: {}}}},
                }
            },
            "/api/jobs/": {
                "get": {
                    "operationId": "listJobs",
                    "summary": "The caller's jobs, by due time (everyone's with scheduling.view_scheduledjob).",
                    "parameters": list_parameters,
                    "responses": list_responses,
                },
                "head": {
                    "operationId": "headJobs",
                    "parameters": list_parameters,
                    "responses": {code: {"description": r["description"]} for code, r in list_responses.items()},
                },
                "post": {
                    "operationId": "createJob",
                    "summary": "Schedule a job (or replace or keep the caller's live job with the same key).",
                    "requestBody": {"required": True, "content": {JSON: create_media}},
                    "responses": _responses(
                        {
                            "200": {
                                "description": "A live job had the key: replaced or kept.",
                                "content": {JSON: {"schema": _ref("Created")}},
                                "links": _LINKS,
                            },
                            "201": {
                                "description": "Created.",
                                "headers": {"Location": {"schema": {"type": "string"}}},
                                "content": {JSON: {"schema": _ref("Created")}},
                                "links": _LINKS,
                            },
                        },
                        "400",
                        "401",
                        "403",
                        "409",
                        "413",
                        "415",
                        "429",
                    ),
                },
            },
            "/api/jobs/{job_id}": {
                "parameters": [_JOB_ID],
                "get": {
                    "operationId": "getJob",
                    "summary": "One job with its attempts.",
                    "responses": detail_responses,
                },
                "head": {
                    "operationId": "headJob",
                    "responses": {code: {"description": r["description"]} for code, r in detail_responses.items()},
                },
            },
            "/api/jobs/{job_id}/cancel": {
                "parameters": [_JOB_ID],
                "post": {
                    "operationId": "cancelJob",
                    "summary": "Cancel a pending job. The body may be empty or {}.",
                    "requestBody": {"required": False, "content": {JSON: {"schema": _ref("Empty")}}},
                    "responses": _responses(
                        _job_response("The cancelled job."), "400", "401", "403", "404", "409", "413", "415"
                    ),
                },
            },
            "/api/jobs/{job_id}/abort": {
                "parameters": [_JOB_ID],
                "post": {
                    "operationId": "abortJob",
                    "summary": (
                        "Abort a claimed or running job. A running job's worker interrupts its handler within "
                        "about one heartbeat interval (SCHEDULING_HEARTBEAT_SECONDS), rolls back its atomic writes "
                        "and cancels it, recording who asked and when (202: asked). A claim not started yet is "
                        "cancelled at once (200). 409 `state_conflict`: the job finished before the abort arrived "
                        "(it stays finished), or is pending (cancel it instead). The body may be empty or {}."
                    ),
                    "requestBody": {"required": False, "content": {JSON: {"schema": _ref("Empty")}}},
                    "responses": _responses(
                        {
                            "200": {
                                "description": "The claim had not started: the job is cancelled.",
                                "content": {JSON: {"schema": _ref("AbortedJob")}},
                            },
                            "202": {
                                "description": "The job is running: its worker stops it within a heartbeat.",
                                "content": {JSON: {"schema": _ref("AbortedJob")}},
                            },
                        },
                        "400",
                        "401",
                        "403",
                        "404",
                        "409",
                        "413",
                        "415",
                    ),
                },
            },
            "/api/jobs/{job_id}/reschedule": {
                "parameters": [_JOB_ID],
                "post": {
                    "operationId": "rescheduleJob",
                    "summary": "Move a pending job to due_at, or delay seconds from now.",
                    "requestBody": {"required": True, "content": {JSON: {"schema": _ref("Reschedule")}}},
                    "responses": _responses(
                        _job_response("The moved job."), "400", "401", "403", "404", "409", "413", "415"
                    ),
                },
            },
            **_kind_paths(),
            **openapi_recurrences.paths(example_kind),
        },
        "components": {
            "securitySchemes": {
                "bearerToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (tk_...) issued in the admin; needs no CSRF token.",
                },
                "session": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "sessionid",
                    "description": "A browser session; writes also need the CSRF token (X-CSRFToken header).",
                },
            },
            "schemas": {**_schemas(), **openapi_recurrences.schemas()},
        },
    }


@require_GET
def openapi_json(request: HttpRequest) -> JsonResponse:
    """GET /api/jobs/openapi.json: the document, to anyone (it holds shapes, no data)."""
    return JsonResponse(document(), json_dumps_params={"ensure_ascii": False})
