"""A Django task's result id is random (a UUID in its own column), never the job's sequential id.

The ids of ``scheduling.backends`` were the job ids, so one user's ``get_result(str(id + 1))`` read
another's task (issue 33, finding 4). Task jobs already stored get a random id here: a row whose
payload has the shape the backend writes (``args`` and ``kwargs``, at most ``queue_name`` and
``priority`` beside them). A plain job that happens to have that shape gets one too, harmlessly:
``get_result`` answers only for jobs whose kind is a task.
"""

from django.db import migrations, models

BACKFILL = """
UPDATE scheduling_scheduledjob
SET task_result_id = gen_random_uuid()
WHERE task_result_id IS NULL
  AND jsonb_typeof(payload) = 'object'
  AND payload ?& array['args', 'kwargs']
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_object_keys(payload) AS k(name)
      WHERE k.name NOT IN ('args', 'kwargs', 'queue_name', 'priority', 'run_after')
  )
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0024_one_live_occurrence_and_why_a_recurrence_paused"),
    ]

    operations = [
        migrations.AddField(
            model_name="scheduledjob",
            name="task_result_id",
            field=models.UUIDField(
                blank=True,
                help_text="A Django task's result id (random, never the job's id: scheduling.backends); "
                "empty for other kinds.",
                null=True,
                verbose_name="task result id",
            ),
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.UniqueConstraint(
                condition=models.Q(("task_result_id__isnull", False)),
                fields=("task_result_id",),
                name="scheduledjob_task_result_id_uniq",
            ),
        ),
    ]
