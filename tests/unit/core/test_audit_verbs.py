"""The audit trail's verbs fit its column: the column has no choices (a new verb needs no migration), so
nothing else would refuse a verb too long before an operator's action failed on it."""

from __future__ import annotations

import ast
from pathlib import Path

from scheduling.core import kind_options
from scheduling.due_at import api as jobs_api
from scheduling.models import AuditAction, AuditRecord, action_label

ROOT = Path(kind_options.__file__).parents[1]  # the scheduling package


def _literal_verbs() -> set[str]:
    """The string literals passed as the verb to ``audit.record(...)`` or a module's ``_audit(...)``."""
    verbs = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            if (owner, name) == ("audit", "record") or (owner, name) == ("", "_audit"):
                verbs.add(node.args[0].value)
    return verbs


def test_every_verb_fits_the_action_column():
    literal = _literal_verbs()
    assert {"cancel", "token_create", "recurrence_resume", "schedule_run_now"} <= literal  # the scan finds them
    verbs = (
        literal
        | set(AuditAction.values)
        | set(jobs_api.AUDIT_ACTIONS.values())
        | {option.verb for option in kind_options.KIND_OPTIONS}
    )
    longest = AuditRecord._meta.get_field("action").max_length
    assert {verb for verb in verbs if len(verb) > longest} == set()


def test_a_verb_reads_as_its_label_or_as_itself():
    assert action_label("run_now") == "run now"
    assert action_label("recurrence_pause") == "pause recurrence"
    assert action_label("expedite") == "expedite"
    assert action_label("set_priority") == "set priority"
