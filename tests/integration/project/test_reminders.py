"""tasks/reminders.py through the real runner: the email leaves after the job's commit, once per job."""

from __future__ import annotations

import datetime as dt
import smtplib
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.mail.backends.locmem import EmailBackend
from django.test import override_settings

from scheduling import api
from scheduling.due_at import runner, store
from scheduling.models import JobState, ScheduledJob
from tasks.models import Notification, Trial
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED = "refused@refused.invalid"


class RefusingBackend(EmailBackend):
    """The locmem backend, except that the mail server refuses one address (as SMTP would, with a 550)."""

    def send_messages(self, messages):
        for message in messages:
            if REFUSED in message.recipients():
                raise smtplib.SMTPRecipientsRefused({REFUSED: (550, b"mailbox unavailable")})
        return super().send_messages(messages)


def _reminders(count: int, refused_at: int) -> list[int]:
    users = get_user_model()
    ids = []
    for n in range(count):
        email = REFUSED if n == refused_at else f"user{n}@example.com"
        user = users.objects.create_user(f"user{n}", email=email)
        trial = Trial.objects.create(user=user, ends_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=3))
        payload = {"user_id": user.pk, "trial_id": trial.pk}
        ids.append(api.schedule("reminders.trial_ending", payload, delay=3600, key=trial.reminder_key, owner=user).id)
    return ids


@override_settings(EMAIL_BACKEND="tests.integration.project.test_reminders.RefusingBackend")
def test_fifty_reminders_with_one_refused_address_send_49_emails_none_twice(run_sql):
    """One batch of 50 reminders, the 6th address refused by the mail server: 49 emails, each once; all 50 jobs done."""
    ids = _reminders(50, refused_at=5)
    support.make_due(ids)
    claims = store.claim_due_jobs(100)
    assert len(claims) == 50
    runner.run_batch([(c.id, c.token) for c in claims])
    recipients = Counter(address for message in mail.outbox for address in message.to)
    assert sum(recipients.values()) == 49
    assert set(recipients.values()) == {1}, "nobody got the email twice"
    assert REFUSED not in recipients
    assert set(ScheduledJob.objects.filter(pk__in=ids).values_list("state", flat=True)) == {JobState.DONE}
    assert Notification.objects.count() == 50


def test_a_rerun_of_a_job_that_already_committed_its_notification_sends_nothing(run_sql):
    """A job run again after its notification committed (retried from dead, say) finds the row and sends no email."""
    (job_id,) = _reminders(1, refused_at=-1)
    for _ in range(2):
        run_sql(
            "UPDATE scheduling_scheduledjob SET state = 'pending', due_at = now() - interval '1 ms', token = NULL,"
            " claimed_at = NULL, heartbeat_at = NULL, claimed_by = '', finished_at = NULL WHERE id = %s",
            [job_id],
        )
        (claim,) = store.claim_due_jobs(10)
        assert runner.run_batch([(claim.id, claim.token)]).succeeded == 1
    assert len(mail.outbox) == 1
    assert Notification.objects.count() == 1
