"""The doors rule for the admin: no module of scheduling/web/admin/ writes a row or holds a cursor itself.

Every change goes through ``scheduling.api`` or a mechanism's public functions (``scheduling.fixed.edits``,
``scheduling.web.auth`` for tokens). The check reads the source (ast): a call of a method that writes
(``.update(``, ``.save(``, ``.delete(``, ``.create(`` ...), raw SQL or a cursor, or a call of Django's own
saving through ``super()``, is a finding unless the allow-list below names it and says why.
"""

from __future__ import annotations

import ast

from tests import support

ADMIN = support.ROOT / "scheduling" / "web" / "admin"

WRITES = {
    "update",
    "save",
    "delete",
    "create",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
    "raw",
    "extra",
    "execute",
    "executemany",
    "cursor",
}
# Django's (and django-celery-beat's) own methods that write, when the admin hands over to them with super().
DJANGO_SAVES = {
    "save_model",
    "save_related",
    "save_formset",
    "delete_model",
    "delete_queryset",
    "enable_tasks",
    "disable_tasks",
    "toggle_tasks",
}
RAW = {"RawSQL", "connection", "connections", "cursor"}

# (module, enclosing function, call) -> why it is not the admin writing a row.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("fixed.py", "save_formset", "formset.save(commit=False)"): (
        "commit=False writes nothing: Django builds the policy from its form (and its change message); "
        "scheduling.fixed.edits.save_policy saves it"
    ),
}


def findings(source: str, module: str) -> list[str]:
    """Each write, raw SQL or cursor use in ``source``, as "module:line function: call", minus the allow-list."""
    tree = ast.parse(source)
    out: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            call = _finding(child)
            if call is not None and (module, function, call) not in ALLOWED:
                out.append(f"{module}:{child.lineno} {function}: {call}")
            visit(child, inner)

    visit(tree, "<module>")
    return out


def _finding(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name) and node.id in RAW:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in RAW:
        return ast.unparse(node)
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    name = node.func.attr
    through_super = isinstance(node.func.value, ast.Call) and ast.unparse(node.func.value.func) == "super"
    if name in WRITES or (name in DJANGO_SAVES and through_super):
        return ast.unparse(node)
    return None


def test_no_admin_module_writes_a_row_itself():
    """Every module of scheduling/web/admin/ changes rows only through scheduling.api or a mechanism's functions."""
    modules = sorted(ADMIN.glob("*.py"))
    assert {p.name for p in modules} >= {"jobs.py", "fixed.py", "tokens.py", "kinds.py", "recurrences.py"}
    found = [f for path in modules for f in findings(path.read_text(), path.name)]
    assert not found, "the admin writes rows itself (go through scheduling.api or the mechanism):\n" + "\n".join(found)


def test_every_allowed_write_is_still_there():
    """An allow-list entry whose call is gone is removed, so the list never hides a new write."""
    seen = set()
    for path in ADMIN.glob("*.py"):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef):
                for node in ast.walk(function):
                    if isinstance(node, ast.Call):
                        seen.add((path.name, function.name, ast.unparse(node)))
    assert set(ALLOWED) <= seen, set(ALLOWED) - seen


def test_the_check_finds_what_the_admin_used_to_do():
    """The writes the admin once made itself (a token update, a task save, Django's save, SQL) are found."""
    source = """
def save_model(self, request, obj, form, change):
    ApiToken.objects.filter(pk=obj.pk).update(name=obj.name)
    task.save(update_fields=["task", "kwargs"])
    super().save_related(request, form, formsets, change)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE scheduling_schedulepolicy SET suspend = true")
"""
    found = findings(source, "example.py")
    assert {int(f.split(":")[1].split()[0]) for f in found} == {3, 4, 5, 6, 7}, found
    assert "example.py:3 save_model: ApiToken.objects.filter(pk=obj.pk).update(name=obj.name)" in found
