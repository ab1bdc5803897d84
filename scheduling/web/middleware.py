"""Two middlewares: a request with a NUL character is refused; every request names its actor for the audit trail.

A request whose query string or form holds a NUL character is answered 400 before any view runs.

PostgreSQL cannot store or compare text with NUL in it (psycopg2 raises ``ValueError``), so a
``?kind=%00`` on an admin list, a NUL in ``_selected_action`` or in a login form would otherwise
end as a 500 in whichever view touched the database first. One check at the door covers every
view, including Django's own admin pages and filters. (Lone surrogates cannot arrive this way:
Django decodes query strings and forms with replacement characters.) JSON bodies are the jobs
API's to check, where the reason is given per field.

``AuditMiddleware`` (after Django's ``AuthenticationMiddleware``) runs each request as its
signed-in user's actions (``scheduling.core.audit.acting``): the admin's (door ``admin``) or another
view's (``web``); the JSON API names its token's user itself (door ``api``).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from scheduling.core import audit
from scheduling.models import AuditDoor

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _has_nul(pairs: object) -> bool:
    lists = getattr(pairs, "lists", None)
    if lists is None:
        return False
    return any("\x00" in name or any("\x00" in v for v in values if isinstance(v, str)) for name, values in lists())


class RefuseNulInputMiddleware:
    """400 for any request with a NUL in a query parameter or a form field (name or value)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        bad = _has_nul(request.GET)
        if not bad and request.method == "POST" and request.content_type in FORM_TYPES:
            bad = _has_nul(request.POST)
        if bad:
            reason = "A query parameter or form field contains a NUL character."
            if request.path.startswith("/api/"):
                return JsonResponse({"error": {"status": 400, "code": "bad_request", "message": reason}}, status=400)
            return HttpResponseBadRequest(reason)
        return self.get_response(request)


class AuditMiddleware:
    """Runs the request as its user's actions for the audit trail; the door is read from the resolved URL."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with audit.acting(_request_actor(request)):
            return self.get_response(request)


def _request_actor(request: HttpRequest) -> audit.Actor:
    """The request's user, and ``admin`` for the admin site's URLs (``web`` for other views), read when recorded."""

    def door() -> str:
        match = getattr(request, "resolver_match", None)
        return AuditDoor.ADMIN if match is not None and "admin" in match.namespaces else AuditDoor.WEB

    return audit.Actor(door=door, user=lambda: getattr(request, "user", None))
