"""The audit record's action takes any verb: its choices leave the field (and the migrations).

A new bulk action or per-kind option records a verb of its own; with the choices in the field,
each such verb needed an ``AuditAction`` entry and a migration altering nothing in the database.
Labels stay in ``AuditAction`` (``action_label``). No SQL: choices are not in the schema.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0035_scheduledjob_retired_by_its_recurrence'),
    ]

    operations = [
        migrations.AlterField(
            model_name='auditrecord',
            name='action',
            field=models.CharField(
                help_text='What was done: a verb (AuditAction labels the usual ones).', max_length=20, verbose_name='action'
            ),
        ),
    ]
