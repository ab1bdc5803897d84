"""One pause switch: a suspended schedule's periodic task is disabled, so "Enabled" shows the truth.

From here on the admin shows only the task's "Enabled" box and keeps the policy's ``suspend``
equal to "not enabled". Schedules suspended before this migration keep not running: their task is
disabled (suspend stays set). Reversing leaves the tasks disabled: nothing tells which were
disabled by this migration.
"""

from django.db import migrations


def disable_suspended(apps, schema_editor):
    policy = apps.get_model("scheduling", "SchedulePolicy")
    task = apps.get_model("django_celery_beat", "PeriodicTask")
    suspended = policy.objects.filter(suspend=True).values_list("periodic_task_id", flat=True)
    task.objects.filter(pk__in=list(suspended), enabled=True).update(enabled=False)
    # Disabled tasks' policies are suspended too: the two flags agree everywhere.
    policy.objects.filter(periodic_task__enabled=False, suspend=False).update(suspend=True)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0007_jobattempt_add_traceback"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [
        migrations.RunPython(disable_suspended, migrations.RunPython.noop, elidable=True),
    ]
