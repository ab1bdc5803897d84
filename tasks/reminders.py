"""Reminders: the trial-ending email, sent after the job commits, at most once per job.

The handler records a ``Notification`` (unique per job: ``job.idempotency_key``) and sends the
email in ``transaction.on_commit``: the row commits exactly once, with the job's ``done``, and the
email leaves only after that commit. An attempt that fails or is rolled back (a crash before the
commit, a sibling's failure) sends nothing; a later attempt of the same job finds the row and sends
nothing again. What is left is the window between the commit and the send: a crash there loses
the email (at most once). A refused address raises in the callback, after the commit: the job stays
done and the failure is logged with the job id.

Any user may schedule it through the JSON API for their own trial (the ``Access`` predicate); the
handler checks again that the trial and the user are the job owner's, so a job naming someone
else's trial sends nothing.
"""

from __future__ import annotations

import logging
import smtplib
from typing import Any

from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction

from scheduling import registry
from tasks.models import Notification, Trial

logger = logging.getLogger(__name__)

TRIAL_ENDING_SCHEMA = {
    "type": "object",
    "properties": {
        "user_id": {"type": "integer", "minimum": 1},
        "trial_id": {"type": "integer", "minimum": 1},
    },
    "required": ["user_id", "trial_id"],
    "additionalProperties": False,
}


def owns_trial(user: Any, payload: dict[str, Any]) -> bool:
    """The payload names ``user`` and one of their trials."""
    return payload["user_id"] == user.pk and Trial.objects.filter(pk=payload["trial_id"], user_id=user.pk).exists()


@registry.handler(
    "reminders.trial_ending",
    schema=TRIAL_ENDING_SCHEMA,
    timeout=30,
    max_attempts=5,
    backoff=registry.Backoff(base_seconds=30, cap_seconds=3600),
    api=registry.Access(predicate=owns_trial),
    critical=True,  # customers wait on it: /healthz counts its overdue jobs
)
def trial_ending(job: registry.Job) -> None:
    """Email the user that their trial ends soon; records a notification unique per job."""
    user = get_user_model().objects.filter(pk=job.payload["user_id"]).first()
    trial = Trial.objects.filter(pk=job.payload["trial_id"]).first()
    if user is None or trial is None or trial.upgraded_at is not None:
        logger.info("trial reminder not needed", extra={"job_id": job.id, "action": "skipped"})
        return
    if trial.user_id != user.pk or (job.owner_id is not None and user.pk != job.owner_id):
        logger.warning("trial reminder names another owner's trial", extra={"job_id": job.id, "action": "refused"})
        return
    subject = f"Your {trial.plan} trial ends on {trial.ends_at:%Y-%m-%d}"
    _notification, created = Notification.objects.get_or_create(
        idempotency_key=job.idempotency_key, defaults={"user": user, "subject": subject}
    )
    if not created:  # an earlier attempt of this job committed its notification: it was sent then
        logger.info("trial reminder already sent", extra={"job_id": job.id, "action": "duplicate_suppressed"})
        return
    address = user.email or f"{user.get_username()}@example.invalid"
    transaction.on_commit(lambda: _send(job.id, subject, address))


def _send(job_id: int | None, subject: str, address: str) -> None:
    """The email itself: runs once the job's transaction has committed (the notification with it)."""
    try:
        send_mail(subject, "Upgrade now to keep your projects running.", None, [address])
    except (smtplib.SMTPException, OSError):  # refused, or the mail server unreachable
        logger.warning("trial reminder not delivered", extra={"job_id": job_id, "action": "send_failed"})
        raise  # the runner records the failed callback against the job
