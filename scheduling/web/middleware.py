"""A request whose query string or form holds a NUL character is answered 400 before any view runs.

PostgreSQL cannot store or compare text with NUL in it (psycopg2 raises ``ValueError``), so a
``?kind=%00`` on an admin list, a NUL in ``_selected_action`` or in a login form would otherwise
end as a 500 in whichever view touched the database first. One check at the door covers every
view, including Django's own admin pages and filters. (Lone surrogates cannot arrive this way:
Django decodes query strings and forms with replacement characters.) JSON bodies are the jobs
API's to check, where the reason is given per field.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

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
