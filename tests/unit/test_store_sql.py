"""The named-SQL loader: every block found, names unique."""

from __future__ import annotations

import re

import pytest

from scheduling.core import store


def test_every_named_block_is_loaded():
    """Each `-- name:` line in queries.sql becomes one entry with a statement body."""
    text = store.SQL_FILE.read_text()
    names = re.findall(r"^--\s*name:\s*(\w+)\s*$", text, flags=re.MULTILINE)
    loaded = store.queries()
    assert sorted(loaded) == sorted(names)
    for name, sql in loaded.items():
        assert re.search(r"\b(SELECT|INSERT|UPDATE|DELETE|WITH)\b", sql), name
        assert not sql.rstrip().endswith(";"), name


def test_duplicate_names_are_refused():
    """Two blocks with one name are a loading error, not a silent override."""
    with pytest.raises(ValueError, match="defined twice"):
        store.parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_comments_before_first_name_are_ignored():
    """Text before the first named block belongs to no query."""
    assert store.parse_queries("-- header\n-- name: q\nSELECT 1;\n") == {"q": "SELECT 1"}
