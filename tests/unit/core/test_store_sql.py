"""The named-SQL loader: every block found, names unique."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from scheduling.core import store


def test_every_named_block_is_loaded():
    """Each `-- name:` line in queries.sql becomes one entry with a statement body."""
    text = store.SQL_FILE.read_text()
    names = re.findall(r"^--\s*name:\s*(\w+)\s*$", text, flags=re.MULTILINE)
    loaded = store.queries()
    assert sorted(loaded) == sorted(names)
    for name, sql in loaded.items():
        assert re.search(r"\b(SELECT|INSERT|UPDATE|DELETE|WITH|SET CONSTRAINTS)\b", sql), name
        assert not sql.rstrip().endswith(";"), name


def test_duplicate_names_are_refused():
    """Two blocks with one name are a loading error, not a silent override."""
    with pytest.raises(ValueError, match="defined twice"):
        store.parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_comments_before_first_name_are_ignored():
    """Text before the first named block belongs to no query."""
    assert store.parse_queries("-- header\n-- name: q\nSELECT 1;\n") == {"q": "SELECT 1"}


# Modules that may open a cursor besides the store: lock, leadership and LISTEN sessions on their own psycopg2
# connections, which read or write no table (see the store's docstring).
SESSION_MODULES = {"core/locks.py", "core/leadership.py"}


def _cursor_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cursor"
    ]


def test_only_the_store_holds_a_cursor_on_djangos_connection():
    """No module but the store opens a cursor; the lock and LISTEN sessions use their own connections only."""
    package = Path(store.__file__).parents[1]
    found = {
        str(path.relative_to(package)): lines
        for path in sorted(package.rglob("*.py"))
        if "migrations" not in path.parts and (lines := _cursor_calls(path))
    }
    assert set(found) - {"core/store.py"} == SESSION_MODULES
    for name in SESSION_MODULES:
        source = (package / name).read_text()
        assert "from django.db import connection" not in source, name
        assert "dedicated_connection" in source, name
