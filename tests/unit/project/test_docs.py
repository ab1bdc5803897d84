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


# Terms of designs that are gone: each (pattern, where it must not come back, what is true now).
OBSOLETE_TERMS = [
    (r"claim task", ("docs", "README.md"), "the leader worker's control loop claims (scheduling/due_at/control.py)"),
    (r"the claim and the sweep", ("docs", "README.md"), "beat sends fixed-time ticks only; the control loop claims"),
    (r"scheduling/conf\.py", ("docs", "README.md", "project", "scheduling"), "it is scheduling/core/conf.py"),
    (r"asked_at", ("scheduling",), "wake_on_commit(in_seconds) takes no time of asking"),
    # the implicit lifecycle: "running" spelled as a started claim, "claimed" as one not started
    (r"claimed_by\s*<>\s*''", ("scheduling", "docs"), "a started job is in the running state"),
    (r"claimed_by\s*=\s*''(?!,)", ("scheduling", "docs"), "a claim not yet started is in the claimed state"),
    (r"claimed_by=\"\"(?!,)", ("scheduling",), "a claim not yet started is in the claimed state"),
]


def _texts(where: tuple[str, ...]) -> dict[str, str]:
    """Every doc, SQL and Python file under ``where`` (paths from the repository root), by path."""
    files: dict[str, str] = {}
    for name in where:
        path = ROOT / name
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in (".md", ".py", ".sql")]
        for file in found:
            if "migrations" not in file.parts:
                files[file.relative_to(ROOT).as_posix()] = file.read_text()
    return files


def test_obsolete_terms_do_not_come_back():
    """Terms of designs that are gone (beat's claim task, scheduling/conf.py, the implicit running test) stay gone."""
    found = [
        f"{path}: {term!r} ({truth})"
        for term, where, truth in OBSOLETE_TERMS
        for path, text in _texts(where).items()
        if re.search(term, text, flags=re.IGNORECASE)
    ]
    assert not found, found


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


CHECK_ID = re.compile(r"""id=["'](scheduling\.[EW]\d{3})["']""")


def test_the_checks_table_has_a_row_for_every_system_check():
    """Every id a system check can report (``id="scheduling.E001"`` in the code) has its row in installing.md."""
    raised = {m for path in (ROOT / "scheduling").rglob("*.py") for m in CHECK_ID.findall(path.read_text())}
    table = _section((DOCS / "installing.md").read_text(), "The checks that catch a missing piece")
    rows = set(re.findall(r"^\| `(scheduling\.[EW]\d{3})` \|", table, flags=re.MULTILINE))
    assert raised, "no check id found in the code"
    assert raised <= rows, sorted(raised - rows)
