"""The documentation stays true to the code: generated parts, the map of modules, variables, links."""

from __future__ import annotations

import re

from scheduling.core import conf
from tests.support import ROOT

DOCS = ROOT / "docs"
README_LIMIT_BYTES = 12_000
# Every way project/settings.py and project/env.py read a variable: os.environ.get("X"),
# os.environ["X"], os.getenv("X"), env.get_int("X", ...), env.get_bool(...), env.get_list(...).
ENV_READ = re.compile(
    r"""(?:os\.environ\.get|os\.environ\.setdefault|os\.getenv|env\.get_\w+)\(\s*["']([A-Z][A-Z0-9_]*)["']"""
    r"""|os\.environ\[\s*["']([A-Z][A-Z0-9_]*)["']\s*\]"""
)
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _between(text: str, start: str, end: str) -> str:
    _head, found_start, rest = text.partition(start)
    body, found_end, _tail = rest.partition(end)
    assert found_start, f"marker {start} not found"
    assert found_end, f"marker {end} not found"
    return body


def _section(text: str, heading: str) -> str:
    """The body of the level-2 section titled ``heading`` (up to the next level-2 heading)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def test_settings_reference_matches_conf():
    """The settings table between the markers in docs/configuration.md is exactly conf.reference()."""
    text = (DOCS / "configuration.md").read_text()
    table = _between(text, "<!-- settings-reference:start -->", "<!-- settings-reference:end -->")
    assert table.strip() == conf.reference().strip(), (
        "docs/configuration.md is out of date: paste `.venv/bin/python -m scheduling.core.conf` between the markers"
    )


def test_architecture_map_names_every_module_and_only_real_paths():
    """Every path in the architecture map exists, and every scheduling/ module (bar __init__, migrations) is in it."""
    section = _section((DOCS / "architecture.md").read_text(), "Map of the code")
    named = set(re.findall(r"`((?:scheduling|tasks|project)/[^`\s]*)`", section))
    missing_paths = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing_paths, f"the map names paths that do not exist: {missing_paths}"
    modules = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "scheduling").rglob("*.py")
        if path.name != "__init__.py" and "migrations" not in path.parts
    }
    unmapped = sorted(modules - named)
    assert not unmapped, f"docs/architecture.md's map does not mention: {unmapped}"


def test_readme_is_short_and_starts_with_its_title():
    """README.md is under 12 KB and its first line is a '# ' title."""
    readme = ROOT / "README.md"
    assert readme.stat().st_size < README_LIMIT_BYTES, f"README.md is {readme.stat().st_size} bytes"
    assert readme.read_text().splitlines()[0].startswith("# ")


def test_every_environment_variable_read_by_the_settings_is_documented():
    """Each variable project/settings.py or project/env.py reads has a row in docs/configuration.md's table."""
    names: set[str] = set()
    for source in ("project/settings.py", "project/env.py"):
        for match in ENV_READ.finditer((ROOT / source).read_text()):
            names.add(match.group(1) or match.group(2))
    assert {"DATABASE_URL", "SCHEDULING_LEASE_SECONDS", "CELERY_TASK_DEFAULT_QUEUE"} <= names  # the regex finds them
    table = _section((DOCS / "configuration.md").read_text(), "Environment variables")
    undocumented = sorted(name for name in names if f"| `{name}` |" not in table)
    assert not undocumented, f"docs/configuration.md does not document: {undocumented}"


def test_bench_readme_table_matches_the_results():
    """The table in bench/README.md is what `python -m bench.report` renders from bench/results."""
    from bench import report

    table = _between(report.README.read_text(), report.START, report.END)
    assert table.strip() == report.markdown().strip(), "run `.venv/bin/python -m bench.report --write`"


def test_relative_links_in_the_documents_resolve():
    """Every relative link in README.md, docs/*.md and bench/README.md points at a file that exists."""
    broken = []
    for document in [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in MARKDOWN_LINK.findall(document.read_text()):
            if "://" in target:
                continue
            if not (document.parent / target).exists():
                broken.append(f"{document.relative_to(ROOT)} -> {target}")
    assert not broken, f"broken links: {broken}"
