"""The pieces every part of the OpenAPI document shares: references, the error body and its answers.

``openapi.py`` (jobs and kinds) and ``openapi_recurrences.py`` build their paths from these, so an
error answer is described once for the whole of ``/api/``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduling.web import paging

JSON = "application/json"


def ref(name: str) -> dict[str, str]:
    """A reference to ``#/components/schemas/<name>``."""
    return {"$ref": f"#/components/schemas/{name}"}


def error(description: str) -> dict[str, Any]:
    """An error answer: the ``Error`` body, with ``description``."""
    return {"description": description, "content": {JSON: {"schema": ref("Error")}}}


ERRORS: dict[str, dict[str, Any]] = {
    "400": error("The request is wrong; `error.message` says why."),
    "401": {
        "description": "No credentials, or a bad or revoked token.",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
        "content": {JSON: {"schema": ref("Error")}},
    },
    "403": error(
        "CSRF check failed (session callers), or the caller may not change this job, or may not schedule this kind "
        "(`kind_not_allowed`: an unknown kind gets the same answer, judged before the payload is read)."
    ),
    "404": error("No such job for this caller (another owner's job is a 404 too)."),
    "409": error("The job's state forbids the change, or `on_conflict: error` met the caller's live job for the key."),
    "413": error("The body, or the payload, is over the limit."),
    "415": error("The body is not `application/json`."),
    "429": {
        "description": (
            "Too many: `rate_limited` (the owner's creations are over SCHEDULING_API_CREATE_BURST at once or "
            "SCHEDULING_API_CREATE_RATE_PER_SECOND) or `quota_exceeded` (over SCHEDULING_API_MAX_PENDING_JOBS "
            "pending jobs). Superusers are exempt. `Retry-After` (and `error.retry_after`) says when to try again."
        ),
        "headers": {
            "Retry-After": {"description": "Whole seconds to wait.", "schema": {"type": "integer", "minimum": 1}}
        },
        "content": {JSON: {"schema": ref("Error")}},
    },
}


def responses(ok: dict[str, Any], *codes: str, errors: dict[str, Any] | None = None) -> dict[str, Any]:
    """``ok`` plus the error answers ``codes`` (from ``errors`` first, then ``ERRORS``)."""
    own = errors or {}
    return {**ok, **{code: own.get(code) or ERRORS[code] for code in codes}}


def head(answers: dict[str, Any]) -> dict[str, Any]:
    """The answers of a HEAD beside a GET: the same codes, no bodies."""
    return {code: {"description": answer["description"]} for code, answer in answers.items()}


def list_parameters(
    states: Iterable[str], filters: Iterable[str], max_page_size: int, default_page_size: int
) -> list[Any]:
    """A paged list's query parameters: ``state`` (comma-separated), string ``filters``, ``cursor``, ``page``, ...."""
    return [
        {
            "name": "state",
            "in": "query",
            "description": f"Comma-separated states: {', '.join(states)}.",
            "schema": {"type": "string"},
        },
        *({"name": name, "in": "query", "schema": {"type": "string"}} for name in filters),
        {
            "name": "cursor",
            "in": "query",
            "description": (
                "Where a page starts: the opaque value in the previous page's `next` link (keyset paging; "
                "any depth at the cost of one page). Not with `page`; a value this API did not give out is 400 "
                "`invalid_cursor`."
            ),
            "schema": {"type": "string", "maxLength": paging.MAX_CURSOR_CHARACTERS},
        },
        {
            "name": "page",
            "in": "query",
            "description": (
                f"A page number, while the page starts within the first {paging.MAX_OFFSET_ROWS} rows "
                "((page - 1) * page_size); deeper is 400 `page_too_deep`: follow `next` instead."
            ),
            "schema": {"type": "integer", "minimum": 1, "maximum": 10**6},
        },
        {
            "name": "page_size",
            "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": max_page_size, "default": default_page_size},
        },
    ]


def page_schema(item: str, description: str) -> dict[str, Any]:
    """A list's page (``paging.page``'s body) whose ``results`` are ``item`` objects."""
    return {
        "type": "object",
        "additionalProperties": False,
        "description": description,
        "required": ["count", "count_exact", "page", "pages", "page_size", "next", "previous", "results"],
        "properties": {
            "count": {
                "type": "integer",
                "description": f"Rows matching the filters, counted up to {paging.MAX_COUNT} (see count_exact).",
            },
            "count_exact": {
                "type": "boolean",
                "description": f"False when more than {paging.MAX_COUNT} rows match: count is then a lower bound.",
            },
            "page": {"type": "integer", "nullable": True, "description": "The page number; null on a cursor page."},
            "pages": {"type": "integer", "nullable": True, "description": "Null when count is not exact."},
            "page_size": {"type": "integer"},
            "next": {
                "type": "string",
                "nullable": True,
                "description": "The next page (a cursor link, stable while rows are added); null on the last page.",
            },
            "previous": {
                "type": "string",
                "nullable": True,
                "description": "The previous page number's link; null on page 1 and on cursor pages.",
            },
            "results": {"type": "array", "items": ref(item)},
        },
    }
