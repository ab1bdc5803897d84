"""The demo data command the run command calls."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from scheduling import api
from scheduling.models import JobState, ScheduledJob
from tasks.models import Trial

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo_is_idempotent():
    """Running seed_demo twice leaves one trial, one reminder and one of each sample job."""
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)
    trial = Trial.objects.get()
    reminder = ScheduledJob.objects.get(key=trial.reminder_key)
    assert reminder.state == JobState.PENDING
    assert reminder.owner_id == trial.user_id
    assert ScheduledJob.objects.filter(key__startswith="demo:").count() == 3
    assert PeriodicTask.objects.filter(policy__isnull=False).exists()


def test_seed_demo_adds_nothing_once_the_demo_jobs_have_finished():
    """Once the demo jobs have ended (cancelled, like done or dead) and the trial was upgraded, seeding adds nothing."""
    call_command("seed_demo", verbosity=0)
    jobs_before = ScheduledJob.objects.count()
    for job in ScheduledJob.objects.all():
        api.cancel(job.id)  # a final state frees the key, as a finished or dead job does
    Trial.objects.update(upgraded_at=timezone.now())
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)
    assert ScheduledJob.objects.count() == jobs_before
    assert not ScheduledJob.objects.filter(state=JobState.PENDING).exists()
    assert Trial.objects.count() == 1


def test_seed_demo_leaves_the_name_admin_free_for_createsuperuser(django_user_model):
    """seed_demo makes no half user "admin": createsuperuser --username admin works after it."""
    call_command("seed_demo", verbosity=0)
    assert not django_user_model.objects.filter(username="admin").exists()
    owner = Trial.objects.get().user
    assert (owner.username, owner.is_staff, owner.has_usable_password()) == ("demo-customer", False, False)
    call_command("createsuperuser", username="admin", email="a@example.invalid", interactive=False, verbosity=0)
    assert django_user_model.objects.get(username="admin").is_superuser
