"""Claiming and sweeping moved from beat ticks to the workers' control loop: the periodic tasks beat
used to send for them (synced from the old CELERY_BEAT_SCHEDULE) are removed, so an upgraded
deployment's beat stops sending one-pass claims every second."""

from django.db import migrations

LEGACY_ENTRIES = ("timekeeper-claim", "timekeeper-sweep")


def remove_legacy_entries(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=LEGACY_ENTRIES, task__in=("scheduling.claim", "scheduling.sweep")).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0004_scheduledjob_key_unique_per_owner"),
    ]

    operations = [
        migrations.RunPython(remove_legacy_entries, migrations.RunPython.noop),
    ]
