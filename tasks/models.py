"""The demo product's tables and the records job handlers keep to stay idempotent."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


class Trial(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="user",
        on_delete=models.CASCADE,
        related_name="trials",
        help_text="Who is trying the product.",
    )
    plan = models.CharField("plan", max_length=50, default="pro", help_text="The plan being tried.")
    ends_at = models.DateTimeField("ends at", help_text="When the trial ends.")
    upgraded_at = models.DateTimeField("upgraded at", null=True, blank=True, help_text="When the user upgraded.")
    created_at = models.DateTimeField("created at", db_default=Now(), help_text="When the trial started.")

    class Meta:
        verbose_name = "trial"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"trial {self.pk} of {self.user_id} ({self.plan})"

    @property
    def reminder_key(self) -> str:
        """The scheduled job key of this trial's ending reminder."""
        return f"trial-ending:{self.pk}"


class Notification(models.Model):
    idempotency_key = models.CharField(
        "idempotency key", max_length=200, unique=True, help_text="One notification per job: a re-run sends nothing."
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="user",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="notifications",
        help_text="The recipient.",
    )
    channel = models.CharField("channel", max_length=20, default="email", help_text="How it was sent.")
    subject = models.CharField("subject", max_length=200, help_text="What it said, in one line.")
    sent_at = models.DateTimeField("sent at", db_default=Now(), help_text="When it was sent.")

    class Meta:
        verbose_name = "notification"
        ordering = ["-sent_at"]

    def __str__(self) -> str:
        return f"{self.channel} to {self.user_id}: {self.subject}"


class PaymentState(models.TextChoices):
    PENDING = "pending", "pending"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"


class Payment(models.Model):
    reference = models.CharField("reference", max_length=64, unique=True, help_text="The payment's business id.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="payments",
        help_text="Whose payment it is; only they may ask for it to be retried (None: the system's).",
    )
    amount_cents = models.PositiveIntegerField("amount (cents)", help_text="How much to charge.")
    state = models.CharField(
        "state", max_length=16, choices=PaymentState.choices, default=PaymentState.PENDING, help_text="Outcome so far."
    )
    attempts = models.PositiveIntegerField("attempts", default=0, help_text="Charges tried.")
    last_error = models.TextField("last error", blank=True, default="", help_text="Why the last charge failed.")
    updated_at = models.DateTimeField("updated at", db_default=Now(), help_text="Last change.")

    class Meta:
        verbose_name = "payment"
        # Checked by payments.retry's Access: retrying a charge through the API is an explicit grant.
        permissions = [("schedule_payment", "Can schedule retries of their own payments")]

    def __str__(self) -> str:
        return f"payment {self.reference} ({self.state})"


class Execution(models.Model):
    """One row per handler execution, never deduplicated: it is how tests count "ran twice"."""

    idempotency_key = models.CharField("idempotency key", max_length=200, help_text="The job or deferral run.")
    kind = models.CharField("kind", max_length=100, help_text="The handler's kind.")
    pid = models.PositiveIntegerField("pid", help_text="Worker process that ran it.")
    started_at = models.DateTimeField("started at", db_default=Now(), help_text="When it ran (database clock).")

    class Meta:
        verbose_name = "execution"
        indexes = [models.Index(fields=["idempotency_key"], name="execution_key_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.idempotency_key}"
