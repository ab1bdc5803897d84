"""Per-table autovacuum for the two tables that turn over every job: vacuum early and unthrottled.

A job's row is inserted, updated three or four times (claimed, started, done) and deleted by the
pruner, and its attempt is inserted, updated and deleted: thousands of dead tuples a second at
steady load. With PostgreSQL's defaults a table is vacuumed only once 20 % of it is dead
(``autovacuum_vacuum_scale_factor`` 0.2) and the vacuum is throttled (cost delay 2 ms, limit 200),
so on ``bench soak`` (600 jobs/s) the dead tuples and the table grew every minute while the backlog
stayed flat. These settings start a vacuum after 5,000 dead tuples plus 2 % of the table and let it
run at full speed on these two tables only (the rest of the database keeps the defaults); analyze
follows the same rule so the planner sees the table's real size.
"""

from django.db import migrations

TABLES = ("scheduling_scheduledjob", "scheduling_jobattempt")
SETTINGS = {
    "autovacuum_vacuum_threshold": 5000,  # dead tuples before a vacuum (plus the scale factor below)
    "autovacuum_vacuum_scale_factor": 0.02,  # 2 % of the table, not PostgreSQL's 20 %
    "autovacuum_vacuum_insert_scale_factor": 0.02,  # inserted rows count too (visibility map, freezing)
    "autovacuum_analyze_scale_factor": 0.02,  # keep the planner's row counts current
    "autovacuum_vacuum_cost_delay": 0,  # unthrottled: these tables are small and hot, not the whole database
}


def _set(table: str) -> str:
    return f"ALTER TABLE {table} SET ({', '.join(f'{name} = {value}' for name, value in SETTINGS.items())})"


def _reset(table: str) -> str:
    return f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})"


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0018_scheduledjob_add_former_owner_and_refused_messages_counter"),
    ]

    operations = [migrations.RunSQL(_set(table), reverse_sql=_reset(table)) for table in TABLES]
