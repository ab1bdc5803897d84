"""A key's uniqueness covers the jobs waiting to run, not the running one.

Before: one pending or claimed job per (owner, key). A running job's row is locked by its atomic
chunk, so ``schedule(key=K)`` met that lock in ON CONFLICT and waited for the chunk, and a handler
could not schedule its own key's next run. After: one *waiting* job per (owner, key): pending and
never run, or claimed on its first attempt and not yet started. A running job and one waiting
successor may coexist; an attempt that fails, is released or swept returns with attempts >= 1,
outside the index, so those paths never meet a unique violation.

The new index covers a subset of the rows the old one did, so rows that satisfied the old one fit;
``check_rows_fit`` verifies it anyway (a database whose old index was dropped by hand) and stops
with the offending keys rather than failing half-way with an opaque unique violation. Reversing
rebuilds the old index, which refuses a table holding a running job and a waiting successor of
the same key: finish or cancel those first.
"""

import django.db.models.functions.comparison
from django.conf import settings
from django.db import migrations, models

# The new index's predicate, spelled out in CLASHES as in the index.
CLASHES = (
    "SELECT coalesce(owner_id, 0), key, count(*) FROM scheduling_scheduledjob "
    "WHERE key IS NOT NULL AND ((state = 'pending' AND attempts = 0) OR "
    "(state = 'claimed' AND claimed_by = '' AND attempts = 1)) "
    "GROUP BY 1, 2 HAVING count(*) > 1 ORDER BY 1, 2 LIMIT 20"
)


def check_rows_fit(apps, schema_editor):
    """Refuse to build the index over rows it would reject: name the (owner, key) pairs."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CLASHES)
        clashes = cursor.fetchall()
    if clashes:
        listed = ", ".join(f"owner {owner} key {key!r} ({n} jobs)" for owner, key, n in clashes)
        raise RuntimeError(
            f"scheduling 0009: these keys have more than one waiting job: {listed}. "
            "Cancel the extra pending jobs (api.cancel_many) and migrate again."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0008_schedulepolicy_suspended_disables_task"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(check_rows_fit, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.UniqueConstraint(
                django.db.models.functions.comparison.Coalesce("owner", models.Value(0)),
                models.F("key"),
                condition=models.Q(
                    ("key__isnull", False),
                    models.Q(
                        models.Q(("attempts", 0), ("state", "pending")),
                        models.Q(("attempts", 1), ("claimed_by", ""), ("state", "claimed")),
                        _connector="OR",
                    ),
                ),
                name="scheduledjob_waiting_owner_key_uniq",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="scheduledjob",
            name="scheduledjob_live_owner_key_uniq",
        ),
        migrations.AlterField(
            model_name="scheduledjob",
            name="key",
            field=models.CharField(
                blank=True,
                help_text="Optional business key: at most one job waiting to run per owner and key "
                "(e.g. trial-ending:42), beside any running one; jobs without an owner share the system's namespace.",
                max_length=200,
                null=True,
                verbose_name="key",
            ),
        ),
    ]
