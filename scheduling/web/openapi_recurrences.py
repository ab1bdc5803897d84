"""The recurrences API's part of the OpenAPI document: ``/api/recurrences/`` and one recurrence's verbs.

Built from the constants ``recurrences_api`` and ``scheduling.recurring`` check (fields, states,
choices, page sizes, the preview's bound), so the document cannot drift from the views on them.
``tests/integration/web/test_jobs_api_openapi.py`` validates real answers against these schemas.
"""

from __future__ import annotations

from typing import Any

from scheduling.core import registry, validation
from scheduling.models import RecurrenceState
from scheduling.recurring import api as recurring_api
from scheduling.recurring import rules
from scheduling.web import jobs_api, openapi_parts, recurrences_api

JSON = openapi_parts.JSON
ref = openapi_parts.ref
DEFAULT_NEXT = recurrences_api.DEFAULT_NEXT
DETAIL_NEXT = recurrences_api.DETAIL_NEXT

_TIMESTAMP = {"type": "string", "format": "date-time"}
_NULLABLE_TIMESTAMP = {**_TIMESTAMP, "nullable": True}
_INSTANT = {
    "type": "string",
    "format": "date-time",
    "nullable": True,
    "maxLength": jobs_api.MAX_DATETIME_TEXT,
    "description": (
        "ISO-8601 with a UTC offset in whole minutes within ±15:59 (a naive time is a 400), from 2000-01-01 to ten "
        "years ahead."
    ),
}
_ERRORS = {
    "400": openapi_parts.error(
        "The request is wrong; `error.message` says why. `over_limit`: attempts or priority over the kind's caller "
        "bound; `too_frequent`: occurrences closer than SCHEDULING_API_MIN_RECURRENCE_INTERVAL_SECONDS (`every`, or "
        "a cron's shortest gap; superusers are exempt)."
    ),
    "403": openapi_parts.error(
        "CSRF check failed (session callers); `forbidden`: the caller may see this recurrence but not change it "
        "(another owner's may be paused, resumed or cancelled with scheduling.change_recurrence, never changed); "
        "`kind_not_allowed`: the caller may not schedule the kind (an unknown kind gets the same answer, judged "
        "before the payload is read) or not with that payload (the kind's api=Access rule)."
    ),
    "404": openapi_parts.error("No such recurrence for this caller (another owner's is a 404 too), or no such page."),
    "429": {
        **openapi_parts.ERRORS["429"],
        "description": (
            "Too many: `rate_limited` (the jobs API's create rate), `recurrence_quota_exceeded` (the owner holds "
            "SCHEDULING_API_MAX_RECURRENCES active or paused recurrences: cancel one) or `quota_exceeded` (the first "
            "occurrence would pass SCHEDULING_API_MAX_PENDING_JOBS). Superusers are exempt. `Retry-After` says when "
            "to try again."
        ),
    },
    "409": openapi_parts.error(
        "`state_conflict`: the recurrence's state forbids the change (a cancelled or ended one cannot change or "
        "resume); `key_conflict`: `on_conflict: error` met the caller's recurrence with that key."
    ),
}
_ID = {
    "name": "recurrence_id",
    "in": "path",
    "required": True,
    "description": "The recurrence's id: digits only, at most 20 of them.",
    "schema": {"type": "string", "pattern": "^[0-9]{1,20}$"},
}
_LINKS = {
    name: {"operationId": operation, "parameters": {"recurrence_id": "$response.body#/recurrence/id"}}
    for name, operation in (
        ("GetRecurrence", "getRecurrence"),
        ("ChangeRecurrence", "changeRecurrence"),
        ("PauseRecurrence", "pauseRecurrence"),
        ("ResumeRecurrence", "resumeRecurrence"),
        ("CancelRecurrence", "cancelRecurrence"),
        ("NextOccurrences", "nextOccurrences"),
    )
}


def _rule_properties() -> dict[str, Any]:
    """The fields a create and a change share (``recurrences_api.RULE_FIELDS``)."""
    return {
        "payload": {
            "description": (
                "Every occurrence's payload: checked against the kind's JSON Schema and its api=Access rule; at most "
                "SCHEDULING_MAX_PAYLOAD_BYTES."
            ),
        },
        "cron": {
            "type": "string",
            "nullable": True,
            "description": "Five cron fields or a nickname (@daily) on the zone's wall clock. Exactly one of cron, "
            "every.",
        },
        "every": {
            "type": "number",
            "nullable": True,
            "minimum": 1,
            "maximum": recurrences_api.MAX_EVERY_SECONDS,
            "description": "An interval in seconds instead of a cron expression (at most ten years).",
        },
        "timezone": {"type": "string", "description": "An IANA zone (Europe/Lisbon); default UTC."},
        "starts_at": {**_INSTANT, "description": f"No occurrence before this instant. {_INSTANT['description']}"},
        "ends_at": {
            **_INSTANT,
            "description": f"No occurrence after this instant (after starts_at). {_INSTANT['description']}",
        },
        "dst_gap": {
            "type": "string",
            "enum": list(recurring_api.DST_GAP_CHOICES),
            "description": "A wall time the clock skips: at the end of the gap (shift, default) or not that day.",
        },
        "missed": {
            "type": "string",
            "enum": list(rules.MISSED_CHOICES),
            "description": "Occurrences missed (paused, planner down): skip (default) or run the latest once.",
        },
        "priority": {
            "type": "integer",
            "nullable": True,
            "minimum": registry.MIN_PRIORITY,
            "maximum": registry.MAX_PRIORITY,
            "description": "Each occurrence's priority (default: the kind's).",
        },
        "max_attempts": {
            "type": "integer",
            "nullable": True,
            "minimum": 1,
            "maximum": validation.MAX_ATTEMPTS_LIMIT,
            "description": "Each occurrence's attempts (default: the kind's).",
        },
    }


def schemas() -> dict[str, Any]:
    """The recurrence schemas of ``components.schemas``."""
    recurrence_fields = {
        "id": {"type": "integer"},
        "url": {"type": "string"},
        "kind": {"type": "string"},
        "key": {"type": "string"},
        "state": {"type": "string", "enum": list(RecurrenceState.values)},
        "cron": {"type": "string", "nullable": True, "description": "Null for an interval rule."},
        "every": {"type": "number", "nullable": True, "description": "Seconds; null for a cron rule."},
        "timezone": {"type": "string"},
        "dst_gap": {"type": "string", "enum": list(recurring_api.DST_GAP_CHOICES)},
        "missed": {"type": "string", "enum": list(rules.MISSED_CHOICES)},
        "starts_at": _NULLABLE_TIMESTAMP,
        "ends_at": _NULLABLE_TIMESTAMP,
        "payload": {"description": "Every occurrence's payload."},
        "priority": {"type": "integer", "nullable": True},
        "max_attempts": {"type": "integer", "nullable": True},
        "occurrence_at": {**_NULLABLE_TIMESTAMP, "description": "The instant of the latest occurrence planned."},
        "occurrence_job": {"type": "integer", "nullable": True, "description": "The id of that occurrence's job."},
        "owner": {"type": "integer", "nullable": True},
        "paused_reason": {
            "type": "string",
            "description": "Why the planner paused it (its owner lost access, its kind or rule is unusable); empty "
            "otherwise.",
        },
        "created_at": _TIMESTAMP,
        "updated_at": _TIMESTAMP,
    }
    create = {
        **_rule_properties(),
        "kind": {"type": "string", "description": "A registered kind the caller may schedule with this payload."},
        "key": {
            "type": "string",
            "minLength": 1,
            "maxLength": validation.MAX_KEY_LENGTH,
            "description": "Names the recurrence, unique per owner (digest:42).",
        },
        "on_conflict": {
            "type": "string",
            "enum": list(recurring_api.ON_CONFLICT_CHOICES),
            "description": "The key is taken: change that recurrence (replace, default), return it (keep), or 409.",
        },
    }
    upcoming = {"type": "array", "items": _TIMESTAMP}
    return {
        "Recurrence": {
            "type": "object",
            "additionalProperties": False,
            "required": list(recurrence_fields),
            "properties": {
                **recurrence_fields,
                "next_occurrences": {
                    **upcoming,
                    "description": f"The next {DETAIL_NEXT} instants (not in the list's results).",
                },
            },
        },
        "RecurrencePage": openapi_parts.page_schema("Recurrence", "The caller's recurrences by id."),
        "CreateRecurrence": {
            "type": "object",
            "additionalProperties": False,
            "required": ["kind", "key"],
            "description": "Give exactly one of cron and every.",
            "properties": create,
        },
        "ChangeRecurrence": {
            "type": "object",
            "additionalProperties": False,
            "description": "Only the fields given change; cron replaces an every rule and the other way round.",
            "properties": {**_rule_properties(), "kind": create["kind"]},
        },
        "RecurrenceCreated": {
            "type": "object",
            "additionalProperties": False,
            "required": ["outcome", "recurrence"],
            "properties": {
                "outcome": {"type": "string", "enum": ["created", "replaced", "kept"]},
                "recurrence": ref("Recurrence"),
            },
        },
        "NextOccurrences": {
            "type": "object",
            "additionalProperties": False,
            "required": ["id", "next_occurrences"],
            "properties": {"id": {"type": "integer"}, "next_occurrences": upcoming},
        },
    }


def _one(description: str) -> dict[str, Any]:
    return {"200": {"description": description, "content": {JSON: {"schema": ref("Recurrence")}}}}


def _answers(ok: dict[str, Any], *codes: str) -> dict[str, Any]:
    return openapi_parts.responses(ok, *codes, errors=_ERRORS)


def _verb(operation: str, summary: str, *, creates: bool = False) -> dict[str, Any]:
    """A state change by id; ``creates``: it plans a job, so the create rate and the pending quota answer 429."""
    errors = ("400", "401", "403", "404", "409", "413", "415", *(("429",) if creates else ()))
    return {
        "parameters": [_ID],
        "post": {
            "operationId": operation,
            "summary": f"{summary} The body may be empty or {{}}.",
            "requestBody": {"required": False, "content": {JSON: {"schema": ref("Empty")}}},
            "responses": _answers(_one("The recurrence after the change."), *errors),
        },
    }


def paths(example_kind: str | None) -> dict[str, Any]:
    """The paths under ``/api/recurrences/``; ``example_kind`` (one any caller may schedule) for the create example."""
    list_parameters = openapi_parts.list_parameters(
        RecurrenceState.values, ("kind", "key", "timezone"), jobs_api.MAX_PAGE_SIZE, jobs_api.DEFAULT_PAGE_SIZE
    )
    listed = _answers(
        {
            "200": {
                "description": "A page of the caller's recurrences, by id.",
                "content": {JSON: {"schema": ref("RecurrencePage")}},
            }
        },
        "400",
        "401",
        "404",
    )
    create_media: dict[str, Any] = {"schema": ref("CreateRecurrence")}
    if example_kind is not None:
        create_media["example"] = {
            "kind": example_kind,
            "key": "digest:42",
            "payload": {},
            "cron": "0 9 * * *",
            "timezone": "Europe/Lisbon",
        }
    created = {"schema": ref("RecurrenceCreated")}
    shown = _answers(_one(f"The recurrence with its next {DETAIL_NEXT} occurrences."), "401", "404")
    upcoming = _answers(
        {"200": {"description": "The next n instants.", "content": {JSON: {"schema": ref("NextOccurrences")}}}},
        "400",
        "401",
        "404",
    )
    return {
        "/api/recurrences/": {
            "get": {
                "operationId": "listRecurrences",
                "summary": "The caller's recurrences (everyone's with scheduling.view_recurrence).",
                "parameters": list_parameters,
                "responses": listed,
            },
            "head": {
                "operationId": "headRecurrences",
                "parameters": list_parameters,
                "responses": openapi_parts.head(listed),
            },
            "post": {
                "operationId": "createRecurrence",
                "summary": "Recur a kind on a cron expression or an interval, as the caller's key.",
                "requestBody": {"required": True, "content": {JSON: create_media}},
                "responses": _answers(
                    {
                        "200": {
                            "description": "The key was taken: the recurrence replaced or kept.",
                            "content": {JSON: created},
                            "links": _LINKS,
                        },
                        "201": {
                            "description": "Created, with its first occurrence.",
                            "headers": {"Location": {"schema": {"type": "string"}}},
                            "content": {JSON: created},
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
        "/api/recurrences/{recurrence_id}": {
            "parameters": [_ID],
            "get": {"operationId": "getRecurrence", "summary": "One recurrence.", "responses": shown},
            "head": {"operationId": "headRecurrence", "responses": openapi_parts.head(shown)},
            "patch": {
                "operationId": "changeRecurrence",
                "summary": "Change the rule, zone, payload or policies; the pending occurrence moves.",
                "requestBody": {"required": True, "content": {JSON: {"schema": ref("ChangeRecurrence")}}},
                "responses": _answers(_one("The changed recurrence."), "400", "401", "403", "404", "409", "413", "415"),
            },
        },
        "/api/recurrences/{recurrence_id}/pause": _verb(
            "pauseRecurrence", "Pause: the pending occurrence is cancelled."
        ),
        "/api/recurrences/{recurrence_id}/resume": _verb(
            "resumeRecurrence",
            "Resume: plan again from the latest run (a new job: the create rate applies).",
            creates=True,
        ),
        "/api/recurrences/{recurrence_id}/cancel": _verb("cancelRecurrence", "Cancel: no further occurrence."),
        "/api/recurrences/{recurrence_id}/next": {
            "parameters": [_ID],
            "get": {
                "operationId": "nextOccurrences",
                "summary": "The next n occurrence instants.",
                "parameters": [
                    {
                        "name": "n",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": recurring_api.MAX_PREVIEW,
                            "default": DEFAULT_NEXT,
                        },
                    }
                ],
                "responses": upcoming,
            },
            "head": {"operationId": "headNextOccurrences", "responses": openapi_parts.head(upcoming)},
        },
    }
