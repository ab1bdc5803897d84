"""A started job is ``running``, a state of its own, instead of ``claimed`` with ``claimed_by`` set.

Until now "running" was ``state = 'claimed' AND claimed_by <> ''``, spelled in seven files. The data
moves here (and back on the way down). The claimed set's index keeps its name and its purpose (the
whole-set scans name ``claimed_at IS NOT NULL``; statements by id read the primary key, migration
0021) and now covers both states that hold a claim token; the waiting-key index's "claimed, not yet
started" is now simply ``claimed``. The constraints learn the new state. One transaction: the
table is locked while the index is rebuilt (a few hundred ms per million live claims, and claims
are few).
"""

import django.db.models.functions.comparison
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0022_count_attempts_through_the_job_key"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="scheduledjob",
            name="scheduledjob_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="scheduledjob",
            name="scheduledjob_claim_has_token",
        ),
        migrations.RemoveConstraint(
            model_name="scheduledjob",
            name="scheduledjob_final_has_finished_at",
        ),
        migrations.RemoveConstraint(
            model_name="scheduledjob",
            name="scheduledjob_waiting_owner_key_uniq",
        ),
        migrations.RemoveIndex(
            model_name="scheduledjob",
            name="scheduledjob_claimed_set_idx",
        ),
        migrations.AlterField(
            model_name="scheduledjob",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "pending"),
                    ("claimed", "claimed"),
                    ("running", "running"),
                    ("done", "done"),
                    ("cancelled", "cancelled"),
                    ("dead", "dead"),
                ],
                default="pending",
                help_text="Where the job is in its life.",
                max_length=16,
                verbose_name="state",
            ),
        ),
        migrations.RunSQL(
            "UPDATE scheduling_scheduledjob SET state = 'running' WHERE state = 'claimed' AND claimed_by <> ''",
            "UPDATE scheduling_scheduledjob SET state = 'claimed' WHERE state = 'running'",
        ),
        migrations.AddIndex(
            model_name="scheduledjob",
            index=models.Index(
                condition=models.Q(("claimed_at__isnull", False), ("state__in", ["claimed", "running"])),
                fields=["heartbeat_at"],
                name="scheduledjob_claimed_set_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.UniqueConstraint(
                django.db.models.functions.comparison.Coalesce("owner", models.Value(0)),
                models.F("key"),
                condition=models.Q(
                    ("key__isnull", False),
                    models.Q(
                        models.Q(("attempts", 0), ("state", "pending")),
                        models.Q(("attempts", 1), ("state", "claimed")),
                        _connector="OR",
                    ),
                ),
                name="scheduledjob_waiting_owner_key_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.CheckConstraint(
                condition=models.Q(("state__in", ["pending", "claimed", "running", "done", "cancelled", "dead"])),
                name="scheduledjob_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state__in", ["claimed", "running"]), _negated=True),
                    models.Q(("claimed_at__isnull", False), ("token__isnull", False)),
                    _connector="OR",
                ),
                name="scheduledjob_claim_has_token",
            ),
        ),
        migrations.AddConstraint(
            model_name="scheduledjob",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("state__in", ["pending", "claimed", "running"]), ("finished_at__isnull", False), _connector="OR"
                ),
                name="scheduledjob_final_has_finished_at",
            ),
        ),
    ]
