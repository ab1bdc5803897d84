"""The JSON API's tables: bearer tokens (``ApiToken``) and each owner's creation allowance (``ApiRateBucket``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

__all__ = [
    "ApiRateBucket",
    "ApiToken",
]


class ApiToken(models.Model):
    """A bearer token for services calling the jobs API; only its SHA-256 is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="user",
        on_delete=models.CASCADE,
        related_name="api_tokens",
        help_text="The account the token acts as (jobs are scoped to it).",
    )
    name = models.CharField("name", max_length=100, help_text="What the token is for, e.g. billing-service.")
    key_hash = models.CharField(
        "key hash", max_length=64, unique=True, help_text="SHA-256 of the token; the token itself is shown once."
    )
    created_at = models.DateTimeField("created at", db_default=Now(), help_text="When the token was issued.")
    last_used_at = models.DateTimeField("last used", null=True, blank=True, help_text="Latest request made with it.")
    revoked = models.BooleanField("revoked", default=False, help_text="A revoked token is refused.")

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.user_id})"


class ApiRateBucket(models.Model):
    """One owner's allowance of job creations through the JSON API (a GCRA bucket, on the database clock).

    ``full_at`` is when the owner's burst is whole again: each creation moves it ``1/rate`` seconds
    on (from now, if it had passed), and a creation that would move it further than ``burst/rate``
    ahead of now is refused (``store.take_create_allowance``). One row per owner, shared by every web
    process; deleting rows only forgives.
    """

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="+",
        help_text="The user whose creations are counted.",
    )
    full_at = models.DateTimeField(
        "full at", help_text="When the owner's burst allowance is whole again (database clock)."
    )

    class Meta:
        verbose_name = "API rate bucket"

    def __str__(self) -> str:
        return f"rate bucket of {self.owner_id}"
