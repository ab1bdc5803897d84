"""Who is calling the jobs API: a browser session (with CSRF) or a service's bearer token.

Tokens are ``ApiToken`` rows holding only the SHA-256 of the secret; the secret is shown once when
it is issued. A request with an ``Authorization`` header is judged by the token alone (never by
the session), and needs no CSRF token: a cross-site page cannot make a browser send that header.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware

from scheduling.core import audit
from scheduling.models import ApiToken

TOKEN_BYTES = 32  # entropy of a new token (it is shown as URL-safe base64, 43 characters)
TOKEN_PREFIX = "tk_"  # noqa: S105 - a public prefix that lets people and secret scanners spot a token


def hash_token(raw: str) -> str:
    """The stored form of a token: its SHA-256, hex."""
    return hashlib.sha256(raw.encode()).hexdigest()


def issue_token(user: Any, name: str) -> tuple[ApiToken, str]:
    """Create a token for ``user``; returns the row and the secret, which is not stored anywhere."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    token = ApiToken.objects.create(user=user, name=name, key_hash=hash_token(raw))
    audit.record("token_create", changed=1, selected=1, target=f"token #{token.pk} {name!r} for {user.get_username()}")
    return token, raw


def change_token(token_id: int, *, name: str, revoke: bool = False) -> bool:
    """Rename a token, and revoke it when ``revoke``; never un-revokes. Returns whether it is revoked now."""
    tokens = ApiToken.objects.filter(pk=token_id)
    tokens.update(name=name)
    if revoke:
        revoke_tokens([token_id])
    return bool(tokens.values_list("revoked", flat=True).first())


def revoke_tokens(token_ids: Iterable[int]) -> int:
    """Revoke the live tokens among ``token_ids`` (one UPDATE); how many were live. Revoking is one way."""
    ids = sorted({int(i) for i in token_ids})
    revoked = ApiToken.objects.filter(pk__in=ids, revoked=False).update(revoked=True)
    shown = ", ".join(f"#{i}" for i in ids[: audit.TARGET_IDS_SHOWN])
    audit.record(
        "token_revoke", changed=revoked, selected=len(ids), target=f"token{'s' if len(ids) != 1 else ''} {shown}"
    )
    return revoked


@dataclasses.dataclass(frozen=True)
class Caller:
    """The authenticated caller, or why there is none (``problem``: 401 for the client)."""

    user: AbstractBaseUser | None
    by_token: bool
    problem: str = ""


def identify(request: HttpRequest) -> Caller:
    """The caller of ``request``: a bearer token if the header is present, else the session user."""
    header = request.headers.get("Authorization")
    if header is None:
        user = request.user if request.user.is_authenticated else None
        return Caller(user, by_token=False, problem="" if user else "Authentication required.")
    scheme, _, raw = header.partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        return Caller(None, by_token=True, problem="Use 'Authorization: Bearer <token>'.")
    token = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=hash_token(raw), revoked=False, user__is_active=True)
        .first()
    )
    if token is None:
        return Caller(None, by_token=True, problem="Invalid or revoked token.")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=Now())
    return Caller(token.user, by_token=True)


class _CsrfCheck(CsrfViewMiddleware):
    """Django's CSRF middleware, asked directly: returns the rejection reason instead of a 403 page."""

    def _reject(self, request: HttpRequest, reason: str) -> Any:
        return reason

    def _accept(self, request: HttpRequest) -> None:
        return None


def _no_view(request: HttpRequest) -> HttpResponse:  # pragma: no cover - never called, only inspected
    return HttpResponse(status=204)


def csrf_problem(request: HttpRequest) -> str:
    """Why a session request fails the CSRF check (empty when it passes)."""
    check = _CsrfCheck(lambda req: None)  # type: ignore[arg-type,return-value]
    check.process_request(request)
    reason = check.process_view(request, _no_view, (), {})
    return str(reason) if reason else ""
