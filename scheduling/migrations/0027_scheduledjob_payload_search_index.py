"""A GIN index on the jobs' payloads (``jsonb_path_ops``) for the admin's payload search.

The jobs list finds ``user_id=5`` as ``payload @> '{"user_id": 5}'`` and a JSON path as
``payload @? '$...'``; both operators are served by this index, so a search reads the matching
rows, not the table. ``jsonb_path_ops`` indexes hashes of paths to values only (no keys alone),
which keeps the index small and its upkeep on every insert low. Built ``CONCURRENTLY`` (as
migration 0021 builds its index), so writes to the jobs table do not wait while it is made.
"""

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("scheduling", "0026_auditrecord_operators_audit_trail"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="scheduledjob",
            index=GinIndex(fields=["payload"], name="scheduledjob_payload_gin", opclasses=["jsonb_path_ops"]),
        ),
    ]
