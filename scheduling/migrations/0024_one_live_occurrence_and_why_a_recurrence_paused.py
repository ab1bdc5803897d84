"""One live occurrence per recurrence (its retries included), and why the planner paused a recurrence.

Before this, a failed occurrence went back to pending as a retry while the planner had already
planned its successor, so a recurrence could hold several waiting occurrences, and pause and cancel
touched only the latest (issue 33 item 8). The planner now plans the next occurrence only once the
latest has finished, and ``scheduledjob_one_live_occurrence`` (unique recurrence where the job is
not done, cancelled or dead) makes that the rule whatever races.

Rows from before may break the index: the extra pending occurrences are cancelled first (a
recurrence keeps its newest pending one, or none beside a claimed one). Two claimed occurrences of
one recurrence at the moment of migrating would still fail it: stop the workers for this migration.

``paused_reason`` says why the planner paused a recurrence (an owner deactivated or without the
kind's permission, a kind no longer registered, a rule that cannot be computed);
``recheck_access`` marks recurrences made by outside callers, whose access the planner re-checks.
"""

from django.db import migrations, models

CANCEL_EXTRA_PENDING = """
UPDATE scheduling_scheduledjob AS j
SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE j.recurrence_id IS NOT NULL AND j.state = 'pending'
  AND EXISTS (
      SELECT 1 FROM scheduling_scheduledjob AS o
      WHERE o.recurrence_id = j.recurrence_id AND o.id <> j.id
        AND (o.state IN ('claimed', 'running') OR (o.state = 'pending' AND o.id > j.id)))
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0023_scheduledjob_running_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="recurrence",
            name="paused_reason",
            field=models.CharField(
                blank=True,
                default="",
                help_text="Why the planner paused it (its owner lost access, its kind or rule is unusable); empty "
                "otherwise.",
                max_length=200,
                verbose_name="why paused",
            ),
        ),
        migrations.AddField(
            model_name="recurrence",
            name="recheck_access",
            field=models.BooleanField(
                default=False,
                help_text="Made by an outside caller (the JSON API): the planner pauses it when its owner may no "
                "longer schedule its kind.",
                verbose_name="access re-checked",
            ),
        ),
        migrations.RunSQL(CANCEL_EXTRA_PENDING, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("recurrence__isnull", False),
                    models.Q(("state__in", ["done", "cancelled", "dead"]), _negated=True),
                ),
                fields=("recurrence",),
                name="scheduledjob_one_live_occurrence",
            ),
        ),
    ]
