"""The named-SQL runner and the stores: blocks loaded, names unique, rows built by name, cursors in stores only."""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import re
from pathlib import Path

import pytest

from scheduling.core import db
from scheduling.core import store as core_store
from scheduling.deferrals import store as deferrals_store
from scheduling.due_at import store as jobs_store
from scheduling.fixed import store as fixed_store
from scheduling.models import JobState
from scheduling.recurring import store as recurring_store
from scheduling.web import store as web_store

STORES = [core_store, jobs_store, fixed_store, deferrals_store, recurring_store, web_store]
PACKAGE = Path(db.__file__).parents[1]


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.__name__)
def test_every_named_block_is_loaded(store):
    """Each `-- name:` line of a store's .sql files becomes one entry with a statement body (two, for a
    statement with `-- only <flag>` blocks: it and <name>_without_<flag>)."""
    names = []
    for path in store.SQL.files():
        for block in re.split(r"^(?=--\s*name:)", path.read_text(), flags=re.MULTILINE):
            named = re.match(r"--\s*name:\s*(\w+)\s*$", block, flags=re.MULTILINE)
            if named:
                flags = set(re.findall(r"^[ \t]*--\s*only\s+(\w+)[ \t]*$", block, flags=re.MULTILINE))
                names += [named[1], *(f"{named[1]}_without_{flag}" for flag in flags)]
    loaded = store.SQL.queries
    assert names
    assert sorted(loaded) == sorted(names)
    for name, sql in loaded.items():
        assert re.search(r"\b(SELECT|INSERT|UPDATE|DELETE|WITH|SET CONSTRAINTS|SAVEPOINT)\b", sql), name
        assert not sql.rstrip().endswith(";"), name


def test_every_sql_file_belongs_to_a_store():
    """Every .sql file under scheduling/ sits in the sql/ folder of a store that loads it."""
    loaded = {path for store in STORES for path in store.SQL.files()}
    assert set(PACKAGE.rglob("*.sql")) == loaded


def test_duplicate_names_are_refused():
    """Two blocks with one name are a loading error, not a silent override."""
    with pytest.raises(ValueError, match="defined twice"):
        db.parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_comments_before_first_name_are_ignored():
    """Text before the first named block belongs to no query."""
    assert db.parse_queries("-- header\n-- name: q\nSELECT 1;\n") == {"q": "SELECT 1"}


def test_a_repeat_block_is_written_out_once_per_value_highest_first():
    """A part written once (``-- repeat p in 2..0 joined by UNION ALL``) becomes one copy per value, joined."""
    text = (
        "-- name: q\nSELECT * FROM (\n  -- repeat p in 2..0 joined by UNION ALL\n  SELECT {p} AS n\n"
        "  -- end repeat\n) AS t;\n"
    )
    assert db.parse_queries(text) == {
        "q": "SELECT * FROM (\n  SELECT 2 AS n\n  UNION ALL\n  SELECT 1 AS n\n  UNION ALL\n  SELECT 0 AS n\n) AS t"
    }


def test_a_statement_with_only_blocks_is_loaded_as_its_two_variants():
    """``-- only held`` ... ``-- else`` ... ``-- end only``: the statement with the first part, and
    ``<name>_without_held`` with the else part (or nothing); a statement without such blocks is itself."""
    text = (
        "-- name: q\nSELECT 1\n-- only held\n, 2\n-- else\n, 3\n-- end only\n"
        "-- only held\n, 4\n-- end only\nFROM t;\n-- name: r\nSELECT 5;\n"
    )
    assert db.parse_queries(text) == {
        "q": "SELECT 1\n, 2\n, 4\nFROM t",
        "q_without_held": "SELECT 1\n, 3\nFROM t",
        "r": "SELECT 5",
    }
    with pytest.raises(ValueError, match="one flag"):
        db.parse_queries("-- name: q\nSELECT 1\n-- only a\n, 2\n-- end only\n-- only b\n, 3\n-- end only\n")


def test_the_claim_without_held_kinds_has_no_capped_rate_or_window_branch():
    """The claim's two variants come from one text: the lean one walks and cuts batches like the full one,
    and has none of the capped kinds' walk, the rate windows' reads or their write."""
    full, lean = jobs_store.SQL["claim_due_jobs"], jobs_store.SQL["claim_due_jobs_without_held"]
    code = [re.sub(r"^\s*--.*$", "", sql, flags=re.MULTILINE) for sql in (full, lean)]
    for part in ("capped AS (", "kept AS (", "allowances AS MATERIALIZED (", "counted AS (", "scheduling_kindrate"):
        assert part in code[0], part
        assert part not in code[1], part
    for part in ("walk AS (", "sized AS (", "ranked AS (", "allowed AS (", "claimed AS ("):
        assert part in code[0], part
        assert part in code[1], part


def test_the_claims_priority_walk_is_written_once_and_expanded_for_every_priority():
    """claim.sql writes each branch once; the loaded claim walks priorities 9..0 in the walk and for capped kinds."""
    source = (PACKAGE / "due_at" / "sql" / "claim.sql").read_text()
    assert source.count("FOR UPDATE SKIP LOCKED) AS p{p}") == 1
    assert source.count("FOR UPDATE SKIP LOCKED) AS k{p}") == 1
    claim = jobs_store.SQL["claim_due_jobs"]
    assert [int(n) for n in re.findall(r"SKIP LOCKED\) AS p(\d)", claim)] == list(range(9, -1, -1))
    assert [int(n) for n in re.findall(r"SKIP LOCKED\) AS k(\d)", claim)] == list(range(9, -1, -1))
    assert "{p}" not in re.sub(r"^\s*--.*$", "", claim, flags=re.MULTILINE)


def test_an_include_line_becomes_the_part_indented_like_the_line():
    """``-- include: x`` is replaced by part x (each line indented as the include was); parts are no statements."""
    parts = db.parse_parts("-- part: x\n-- why\nSELECT 1\n  FROM t;\n-- name: q\nSELECT 2;\n")
    assert parts == {"x": "-- why\nSELECT 1\n  FROM t"}
    text = "-- part: x\nSELECT 0;\n-- name: q\nWITH a AS (\n    -- include: x\n)\nSELECT 3;\n"
    assert db.parse_queries(text, parts=parts) == {
        "q": "WITH a AS (\n    -- why\n    SELECT 1\n      FROM t\n)\nSELECT 3"
    }
    with pytest.raises(ValueError, match="names no part"):
        db.parse_queries("-- name: q\n-- include: nothing\n", parts=parts)


INSERT_INTO_JOBS = re.compile(r"\binsert\s+into\s+\"?scheduling_scheduledjob\b", flags=re.IGNORECASE)
ORM_CREATE_JOB = re.compile(r"\bScheduledJob\.objects\.(create|bulk_create|get_or_create|update_or_create)\b")


def test_the_jobs_table_has_one_insert_the_cores_part_and_every_door_includes_it():
    """No .sql or .py file of scheduling/ or tasks/ inserts jobs but core/sql/jobs.sql's part, which every door uses."""
    found = []
    for root in (PACKAGE, PACKAGE.parent / "tasks"):
        for path in sorted([*root.rglob("*.sql"), *root.rglob("*.py")]):
            text = path.read_text()
            found += [(path.relative_to(PACKAGE.parent).as_posix(), m[0]) for m in INSERT_INTO_JOBS.finditer(text)]
            if path.suffix == ".py":
                found += [(path.relative_to(PACKAGE.parent).as_posix(), m[0]) for m in ORM_CREATE_JOB.finditer(text)]
    assert [where for where, _ in found] == ["scheduling/core/sql/jobs.sql"]
    part = db.shared_parts()["insert_into_jobs"]
    doors = sorted(name for store in STORES for name, sql in store.SQL.queries.items() if INSERT_INTO_JOBS.search(sql))
    assert doors == sorted(
        [
            "insert_job",
            "insert_jobs",
            "insert_unique_job",
            "upsert_job_replace",
            "upsert_job_keep",
            "record_dead_deferral",
            "plan_occurrences",
        ]
    )
    for store in STORES:
        for name, sql in store.SQL.queries.items():
            if INSERT_INTO_JOBS.search(sql):
                assert part.splitlines()[-1].strip() in sql, name


def test_every_way_out_of_claimed_and_running_is_the_one_transition_statement():
    """Of the claim and sweep statements only set_job_states ends a claim (clears its token or claimed_at)."""
    ending = re.compile(r"\b(token|claimed_at)\s*=\s*(NULL|CASE)", flags=re.IGNORECASE)
    writers = sorted(
        name
        for name, sql in jobs_store.SQL.queries.items()
        if ending.search(re.sub(r"--[^\n]*", "", sql)) and name not in ("upsert_job_replace", "retry_dead_jobs")
    )
    assert writers == ["set_job_states"]


@dataclasses.dataclass(frozen=True)
class _Row:
    id: int
    state: JobState
    payload: db.Json = None
    due_at: dt.datetime | None = None


def test_rows_are_built_by_column_name():
    """Columns map to fields by name in any order; enums and jsonb text are converted, missing fields take defaults."""
    row = db.build(_Row, {"payload": '{"a": 1}', "state": "dead", "id": 7})
    assert row == _Row(id=7, state=JobState.DEAD, payload={"a": 1})
    assert isinstance(row.state, JobState)


def test_a_column_without_a_field_is_refused():
    """A column the dataclass has no field for is an error naming it, not a silent drop."""
    with pytest.raises(ValueError, match="'oops'"):
        db.build(_Row, {"id": 1, "state": "dead", "oops": 2})


# Modules that may open a cursor besides the stores and the runner: lock, leadership and LISTEN sessions
# on their own psycopg2 connections, which read or write no table (see the core store's docstring).
SESSION_MODULES = {"core/locks.py", "core/leadership.py"}


def _cursor_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cursor"
    ]


def test_only_a_store_holds_a_cursor_on_djangos_connection():
    """Only a store.py (and the runner, core/db.py) opens a cursor; lock and LISTEN sessions have their own."""
    found = {
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts and _cursor_calls(path)
    }
    allowed = {str(Path(store.__file__).relative_to(PACKAGE)) for store in STORES} | {"core/db.py"}
    assert found - allowed == SESSION_MODULES
    for name in SESSION_MODULES:
        source = (PACKAGE / name).read_text()
        assert "from django.db import connection" not in source, name
        assert "dedicated_connection" in source, name
    stores = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("store.py")}
    assert stores == {str(Path(store.__file__).relative_to(PACKAGE)) for store in STORES}
