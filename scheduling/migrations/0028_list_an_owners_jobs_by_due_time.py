"""The jobs API lists an owner's jobs by (due_at, id) from a keyset cursor: give that walk an index.

``GET /api/jobs/?cursor=...`` reads ``owner_id = %s AND due_at >= %s AND (due_at > %s OR id > %s)
ORDER BY due_at, id LIMIT page_size + 1``. Without an index on those columns each page read all of
the owner's rows through ``scheduledjob_owner_state_idx`` and sorted them (300,000 finished jobs:
every page a full read); with it a page is an index range of ``page_size + 1`` entries. Built
``CONCURRENTLY`` so writes to the jobs table do not wait.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("scheduling", "0027_scheduledjob_payload_search_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="scheduledjob",
            index=models.Index(fields=["owner", "due_at", "id"], name="scheduledjob_owner_due_idx"),
        ),
    ]
