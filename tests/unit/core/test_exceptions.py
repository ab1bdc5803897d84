"""The exception tree in ``scheduling.core.exceptions``' docstring is the classes' real hierarchy.

Users catch by these names (``except InvalidSchedule`` also catches ``InvalidRecurrence``), and
the docstring is where they look: it must name every exception once, under its real base.
"""

from __future__ import annotations

import inspect
import re

from scheduling import exceptions as public
from scheduling.core import exceptions

TREE_LINE = re.compile(r"^(?P<indent>[ │├└─]*?)(?:[├└]── )?(?P<name>[A-Z]\w+)\b")


def _documented() -> dict[str, str]:
    """{class name: the parent the docstring draws it under}, read from the tree's indentation."""
    lines = [line for line in (exceptions.__doc__ or "").splitlines() if "── " in line or line == "SchedulingError"]
    parents: list[tuple[int, str]] = []  # (column of the name, name): the open branches
    drawn: dict[str, str] = {}
    for line in lines:
        match = TREE_LINE.match(line)
        assert match, f"not a tree line: {line!r}"
        name = match["name"]
        column = line.index(name)
        while parents and parents[-1][0] >= column:
            parents.pop()
        drawn[name] = parents[-1][1] if parents else "Exception"
        parents.append((column, name))
    return drawn


def _actual() -> dict[str, str]:
    return {
        name: cls.__bases__[0].__name__
        for name, cls in vars(exceptions).items()
        if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == exceptions.__name__
    }


def test_the_docstring_draws_every_exception_under_its_real_base():
    assert _documented() == _actual()


def test_the_public_module_exports_every_exception():
    assert set(_actual()) <= set(dir(public))
