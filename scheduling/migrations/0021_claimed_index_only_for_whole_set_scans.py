"""The claimed index serves only the statements that read every claim; claims addressed by id use the key.

``scheduledjob_claimed_hb_idx`` (``WHERE state = 'claimed'``) was usable by every statement that
says ``state = 'claimed'``, and the statements that finish, start, lock or renew a batch's claims
by id say it. Claim, start and heartbeat each leave a dead version of the row in that index until
the next vacuum, and the statistics of a busy table often say almost nothing is claimed: so in a
spike the planner chose to read the whole index (tens of thousands of dead entries) and hash it
against the batch, 1,500-6,600 buffers a call, where 50 primary-key look-ups read about 150.

The replacement ``scheduledjob_claimed_set_idx`` adds ``claimed_at IS NOT NULL`` to the predicate
(every claim has a claimed_at: ``scheduledjob_claim_has_token``). The sweeper and the counts name it
to use the index; a statement by id does not, so its only way in is the primary key. Both indexes
are built and dropped ``CONCURRENTLY`` (the new one first), so writes to the jobs table do not wait.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE / DROP INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("scheduling", "0020_drop_owner_fk_indexes_covered_by_owner_state"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="scheduledjob",
            index=models.Index(
                condition=models.Q(("claimed_at__isnull", False), ("state", "claimed")),
                fields=["heartbeat_at"],
                name="scheduledjob_claimed_set_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="scheduledjob", name="scheduledjob_claimed_hb_idx"),
    ]
