"""Who is acting: the door sets it once, ``scheduling.api``'s calls record what they did.

A door (the admin and other web views through ``AuditMiddleware``, the JSON API in its endpoint
wrapper, the ``timekeeper`` command in its ``handle``) runs its work inside ``acting(actor)``. The
calls every door shares (``cancel``/``cancel_many``, ``reschedule``/``reschedule_many``,
``run_now_many``, ``retry_dead_many``, ``abort``/``abort_many``, ``pause``, ``resume``,
``set_kind_option`` and ``set_max_running``, ``set_rate``, the recurrences' bulk pause, resume and
cancel, a fixed-time schedule's run now, abort, enable and disable, and the token functions of
``scheduling.web.auth``) call ``record()``, which writes one ``AuditRecord`` in the
caller's transaction when an actor is set, and nothing when none is (application code and the
engine itself are not operators). So a new door sets the actor once, and a new button or
subcommand cannot forget to record: it calls the same functions. Why a table of our own and not
Django's ``LogEntry``: docs/operations.md, "Audit trail".
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import getpass
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from scheduling.models import AuditDoor, AuditRecord

TARGET_IDS_SHOWN = 20  # ids spelled out in a record's target text; all of them are in job_ids


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who acts and through which door; ``user`` may be resolved late (a request's lazy user)."""

    door: Callable[[], str] | str  # an AuditDoor, or a callable returning one (a request's resolved URL)
    user: Callable[[], Any] | Any = None  # a user, or a callable returning one (read when a record is written)
    name: str = ""  # the name to keep when there is no user (cli:<OS user>)

    def resolve(self) -> tuple[str, Any, str]:
        """(door, user or None, name) as they are now."""
        door = self.door() if callable(self.door) else self.door
        user = self.user() if callable(self.user) else self.user
        if user is not None and getattr(user, "is_authenticated", False):
            return door, user, user.get_username()
        return door, None, self.name or "anonymous"


_actor: contextvars.ContextVar[Actor | None] = contextvars.ContextVar("timekeeper_audit_actor", default=None)
_notes: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("timekeeper_audit_notes", default=None)


@contextlib.contextmanager
def acting(actor: Actor) -> Iterator[Actor]:
    """Record the ``scheduling.api`` actions taken inside as ``actor``'s."""
    token = _actor.set(actor)
    try:
        yield actor
    finally:
        _actor.reset(token)


@contextlib.contextmanager
def noting(**details: Any) -> Iterator[None]:
    """Add ``details`` to the records written inside (e.g. the admin list's filter behind "all N matching")."""
    token = _notes.set({**(_notes.get() or {}), **details})
    try:
        yield
    finally:
        _notes.reset(token)


def current() -> Actor | None:
    return _actor.get()


def cli_actor() -> Actor:
    """The command line's actor: ``cli:<OS user>`` (the sudo caller's name under sudo), or ``cli``."""
    try:
        name = os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's arbitrary user)
        name = ""
    return Actor(door=AuditDoor.CLI, name=f"cli:{name}" if name else "cli")


def record(
    action: str,
    *,
    changed: int,
    job_ids: Iterable[int] = (),
    selected: int | None = None,
    kind: str = "",
    target: str = "",
    details: dict[str, Any] | None = None,
) -> AuditRecord | None:
    """One ``AuditRecord`` of ``action`` for the actor in force; None (nothing written) outside a door."""
    actor = _actor.get()
    if actor is None:
        return None
    door, user, name = actor.resolve()
    ids = sorted({int(i) for i in job_ids})
    if not target and ids:
        shown = ", ".join(f"#{i}" for i in ids[:TARGET_IDS_SHOWN])
        target = f"{len(ids)} job{'s' if len(ids) != 1 else ''}: {shown}{' …' if len(ids) > TARGET_IDS_SHOWN else ''}"
    return AuditRecord.objects.create(
        door=door,
        user=user,
        actor=name[:200],
        action=action,
        kind=kind[:200],
        target=target[:500],
        job_ids=ids,
        selected=len(ids) if selected is None else selected,
        changed=changed,
        details={**(_notes.get() or {}), **(details or {})},
    )
