"""The recurrences' doors (``scheduling.recurring.api``): their job options travel whole, not as copied keywords."""

from __future__ import annotations

import ast
import inspect

from scheduling.recurring import api


def _calls(function: object) -> list[ast.Call]:
    tree = ast.parse(inspect.getsource(function))  # type: ignore[arg-type]
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _name(call: ast.Call) -> str:
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")


def test_recur_and_change_recurrence_build_the_job_options_once_and_pass_them_whole():
    """recur/change_recurrence hand one Rule and one JobOptions on; recur's replace path passes them, never keywords."""
    for door, inner in ((api.recur, "recur_with_options"), (api.change_recurrence, "change_with_options")):
        names = [_name(call) for call in _calls(door)]
        assert names.count("JobOptions") == 1, door
        assert inner in names, door
    replace = [
        call for call in _calls(api.recur_with_options) if _name(call) in ("change_recurrence", "change_with_options")
    ]
    assert [(_name(call), [k.arg for k in call.keywords]) for call in replace] == [("change_with_options", ["caller"])]
