"""The one runner of Timekeeper's hand-written SQL: named blocks in, typed rows out.

Each mechanism keeps its statements beside the code that decides (``due_at/sql/*.sql``,
``fixed/sql``, ``deferrals/sql``, ``recurring/sql``, ``web/sql``; the core's own in ``core/sql``)
and runs them through its ``store.py`` with a ``Statements`` of its folder. A file holds named
blocks (``-- name: claim_due_jobs``) with the comment that says why; a folder's files are loaded
once, on first use, and a name defined twice is a loading error. A statement may include a part
the core writes once for every mechanism (``-- include: insert_into_jobs``, the one INSERT into the
jobs table: a ``-- part:`` block of ``core/sql/jobs.sql``); the line becomes the part's text.

Rows come back by column name, never by position: ``fetch_all(Claim, "claim_due_jobs", params)``
builds a frozen dataclass per row from ``cursor.description``. Every column must be a field (a
column without one is an error naming it), a field without a column takes its default. A field
typed as an enum (``JobState``, ``RunState``: the models' ``TextChoices``) gets the enum; a field
typed ``Json`` is decoded when the driver hands jsonb back as text (Django's psycopg2 connections
do). Statements run on Django's connection for the current thread, so they join the caller's
transaction when there is one; ``run_prepared`` runs one on a dedicated session instead, prepared
once there. The few statements every batch runs (a store passes their parameters' ``types``) are
prepared on Django's connection too, unless it goes through a transaction pooler (``orm_prepares``).
Only this module and the stores (``*/store.py``) open a cursor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import json
import logging
import math
import re
import time
import types
import typing
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import psycopg2
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, connections

logger = logging.getLogger(__name__)

R = TypeVar("R")
Params = Mapping[str, Any] | Sequence[Any] | None

# JIT compiles a statement whose estimated cost passes jit_above_cost (100,000 by default): right for
# a report over millions of rows, a loss for a statement that runs in milliseconds however big the
# table. The claim's estimate grows with the table while its statistics are stale (the capped kinds'
# LIMIT is unknown when it is planned): 66,000 claims after the last analyze it was 113,913, and each
# claim compiled for 150 ms to run in 3. The claim and the planner's pick run with this prefix, in
# Timekeeper's own transactions (SET LOCAL ends with them).
NO_JIT = "SET LOCAL jit = off;\n"
# A prepared statement (``run_prepared``) planned once for every set of parameters: the claim's plan
# does not depend on them (its walks are written per priority), and planning it was most of its cost.
GENERIC_PLAN = "SET LOCAL plan_cache_mode = force_generic_plan;\n"
_PARAM = re.compile(r"%\((?P<name>\w+)\)s")
_JSON = "jsonb"
Json = Annotated[Any, _JSON]  # a field holding a decoded jsonb value
_NAME = re.compile(r"^--\s*name:\s*(?P<name>\w+)\s*$")
_PART = re.compile(r"^--\s*part:\s*(?P<name>\w+)\s*$")
_INCLUDE = re.compile(r"^(?P<indent>[ \t]*)--\s*include:\s*(?P<name>\w+)[ \t]*$", flags=re.MULTILINE)
PARTS_FOLDER = Path(__file__).with_name("sql")  # the core's files: where every `-- part:` block lives


# A part written once and repeated for each value of a range, highest first when the range goes down:
#     -- repeat p in 9..0 joined by UNION ALL
#     SELECT ... WHERE priority = ANY(ARRAY[{p}]) ... AS p{p}
#     -- end repeat
# (the claim's walk down the priorities, one branch per value: due_at/sql/claim.sql).
_REPEAT = re.compile(
    r"^(?P<indent>[ \t]*)--\s*repeat\s+(?P<var>\w+)\s+in\s+(?P<first>\d+)\.\.(?P<last>\d+)"
    r"\s+joined by\s+(?P<joiner>.+?)\s*\n"
    r"(?P<body>.*?)^[ \t]*--\s*end repeat\s*$",
    flags=re.MULTILINE | re.DOTALL,
)


def expand_repeats(sql: str) -> str:
    """``sql`` with each ``-- repeat`` block written out once per value, ``{var}`` replaced, joined."""

    def expand(match: re.Match[str]) -> str:
        first, last = int(match["first"]), int(match["last"])
        step = 1 if last >= first else -1
        body = match["body"].rstrip("\n")
        copies = [body.replace("{" + match["var"] + "}", str(v)) for v in range(first, last + step, step)]
        return f"\n{match['indent']}{match['joiner']}\n".join(copies)

    return _REPEAT.sub(expand, sql)


# A part of a statement that only one of its two variants has (the other may have its own, after -- else):
#     -- only held
#     ... (in "x")
#     -- else
#     ... (in "x_without_held")
#     -- end only
# A statement with such blocks is loaded twice: as itself with each block's first part, and as
# "<name>_without_<flag>" with each block's -- else part (or nothing). One text, so the two cannot
# drift apart (the claim without the capped and rate-limited kinds' branches: claim.sql).
_ONLY = re.compile(
    r"^[ \t]*--\s*only\s+(?P<flag>\w+)[ \t]*\n(?P<body>.*?)"
    r"(?:^[ \t]*--\s*else[ \t]*\n(?P<other>.*?))?^[ \t]*--\s*end only[ \t]*(?:\n|$)",
    flags=re.MULTILINE | re.DOTALL,
)


def variants(name: str, sql: str) -> dict[str, str]:
    """``{name: sql}``, or for a statement with ``-- only <flag>`` blocks its two variants (see ``_ONLY``)."""
    flags = {match["flag"] for match in _ONLY.finditer(sql)}
    if not flags:
        return {name: sql}
    if len(flags) > 1:
        raise ValueError(f"query {name!r}: -- only blocks of one flag per statement, not {sorted(flags)}")
    (flag,) = flags
    return {
        name: _ONLY.sub(lambda match: match["body"], sql),
        f"{name}_without_{flag}": _ONLY.sub(lambda match: match["other"] or "", sql),
    }


def _blocks(text: str, source: str, marker: re.Pattern[str]) -> dict[str, str]:
    """The blocks of ``text`` that start with ``marker`` (``-- name:`` or ``-- part:``), {name: raw text}."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME.match(line) or _PART.match(line)
        if match and match.re is marker:
            name = match["name"]
            if name in blocks:
                raise ValueError(f"query {name!r} is defined twice in {source or 'the file'}")
            current = blocks[name] = []
        elif match:
            current = None  # a block of the other kind: not ours
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in blocks.items()}


def parse_parts(text: str, source: str = "") -> dict[str, str]:
    """The ``-- part: x`` blocks of a file, {name: text}: SQL written once and included by statements."""
    return {name: part.strip().rstrip(";") for name, part in _blocks(text, source, _PART).items()}


@functools.cache
def shared_parts() -> dict[str, str]:
    """Every ``-- part:`` block of the core's ``.sql`` files, {name: text}."""
    parts: dict[str, str] = {}
    for path in sorted(PARTS_FOLDER.glob("*.sql")):
        for name, part in parse_parts(path.read_text(), path.name).items():
            if name in parts:
                raise ValueError(f"part {name!r} is defined twice in {PARTS_FOLDER}")
            parts[name] = part
    return parts


def expand_includes(sql: str, parts: Mapping[str, str] | None = None) -> str:
    """``sql`` with each ``-- include: x`` line replaced by part ``x`` (indented like the line)."""
    known = shared_parts() if parts is None else parts

    def include(match: re.Match[str]) -> str:
        if match["name"] not in known:
            raise ValueError(f"-- include: {match['name']} names no part")
        return "\n".join(match["indent"] + line if line else line for line in known[match["name"]].splitlines())

    return _INCLUDE.sub(include, sql)


def parse_queries(text: str, source: str = "", parts: Mapping[str, str] | None = None) -> dict[str, str]:
    """Split a file of ``-- name: x`` blocks into {name: statement}; comments stay in the text.

    A ``-- repeat`` block in a statement is written out (``expand_repeats``), an ``-- include:`` line
    replaced by its part (``expand_includes``; ``parts``, else the core's). ``-- part:`` blocks are no
    statements. A statement with ``-- only`` blocks is loaded as its two variants (``variants``).
    """
    return {
        variant: expand_includes(expand_repeats(text), parts).strip().rstrip(";")
        for name, sql in _blocks(text, source, _NAME).items()
        for variant, text in variants(name, sql).items()
    }


class Statements:
    """The named statements of a folder of ``.sql`` files, loaded once; run them by name."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("*.sql"))

    @functools.cached_property
    def queries(self) -> dict[str, str]:
        """Every named statement of the folder, {name: SQL}."""
        loaded: dict[str, str] = {}
        for path in self.files():
            for name, sql in parse_queries(path.read_text(), path.name).items():
                if name in loaded:
                    raise ValueError(f"query {name!r} is defined twice in {self.folder}")
                loaded[name] = sql
        return loaded

    def __getitem__(self, name: str) -> str:
        return self.queries[name]

    def fetch_all(
        self, cls: type[R], name: str, params: Params = None, *, prefix: str = "", types: Types | None = None
    ) -> list[R]:
        """The rows of statement ``name`` as ``cls`` instances, built by column name.

        ``types`` (each parameter's SQL type): prepared on Django's connection when it may be
        (``run_prepared_here``), else sent as text like the others.
        """
        if types is None:
            return fetch_all_sql(cls, prefix + self[name], params)
        columns, rows = run_prepared_here(name, self[name], params, types, prefix=prefix)
        return rows_as(cls, columns, rows)

    def fetch_one(self, cls: type[R], name: str, params: Params = None) -> R | None:
        """The first row of statement ``name`` as a ``cls`` (None: no row)."""
        rows = self.fetch_all(cls, name, params)
        return rows[0] if rows else None

    def fetch_values(
        self, name: str, params: Params = None, *, prefix: str = "", types: Types | None = None
    ) -> list[Any]:
        """The single column of every row of statement ``name`` (``types``: as ``fetch_all``)."""
        if types is None:
            columns, rows = run(prefix + self[name], params)
        else:
            columns, rows = run_prepared_here(name, self[name], params, types, prefix=prefix)
        if len(columns) != 1:
            raise ValueError(f"{name} returns {len(columns)} columns, not one")
        return [row[0] for row in rows]

    def fetch_value(self, name: str, params: Params = None) -> Any:
        """The single column of the first row of statement ``name`` (None: no row)."""
        values = self.fetch_values(name, params)
        return values[0] if values else None

    def fetch_pairs(self, name: str, params: Params = None) -> dict[Any, Any]:
        """{first column: second column} over the rows of a two-column statement."""
        columns, rows = run(self[name], params)
        if len(columns) != 2:
            raise ValueError(f"{name} returns {len(columns)} columns, not two")
        return {row[0]: row[1] for row in rows}

    def execute(self, name: str, params: Params = None) -> None:
        """Run statement ``name`` for its effect (its rows, if any, are not read)."""
        with connection.cursor() as cursor:
            cursor.execute(self[name], params)

    def explain_json(self, name: str) -> Any:
        """The planner's JSON plan of statement ``name`` (EXPLAIN only: the statement does not run)."""
        _, rows = run("EXPLAIN (FORMAT JSON) " + self[name], None)
        plan = rows[0][0]
        return json.loads(plan) if isinstance(plan, str) else plan


def thread_connections(*, every_alias: bool = False) -> list[Any]:
    """Django's connection wrappers set up in this thread (each one's driver connection read later).

    ``every_alias``: one for each configured database, set up now if not yet (a wrapper connects
    lazily), except an alias this process cannot set up (its backend or driver missing: no handler
    here can use it either).
    """
    if not every_alias:
        return list(connections.all(initialized_only=True))
    wrappers = []
    for alias in connections:
        try:
            wrappers.append(connections[alias])
        except ImproperlyConfigured:
            continue
    return wrappers


def cancel_statements(wrappers: Sequence[Any]) -> None:
    """Ask the server to cancel whatever statement each wrapper's connection runs now (callable from any thread).

    The driver's cancel request (libpq ``PQcancel``) goes over a connection of its own: the statement
    ends with ``QueryCanceled`` in the thread that sent it; an idle connection ignores it.
    """
    for wrapper in wrappers:
        raw = getattr(wrapper, "connection", None)
        if raw is None or getattr(raw, "closed", True):
            continue
        with contextlib.suppress(psycopg2.Error):  # a closed or broken connection: nothing to cancel
            raw.cancel()


@functools.cache
def positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its ``%(name)s`` parameters as ``$1, $2 ...`` (each name one number), and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match["name"] not in names:
            names.append(match["name"])
        return f"${names.index(match['name']) + 1}"

    return _PARAM.sub(number, sql).replace("%%", "%"), tuple(names)


# The statements prepared on each dedicated session (a psycopg2 connection), with when each was
# prepared (time.monotonic()): a prepared statement lives as long as its session, whatever its
# transactions do; a new session prepares again.
_prepared: weakref.WeakKeyDictionary[Any, dict[str, float]] = weakref.WeakKeyDictionary()
# A prepared statement is prepared again this often. Its generic plan is made at its first EXECUTE,
# from the table as it was then, and PostgreSQL makes it again only when something invalidates it
# (an analyze or a vacuum of the table, DDL on it), never because the table grew: a leader that
# prepared its reads on an empty table (a new deploy, a test database, autovacuum slow or off) kept
# a plan that read every pending row of the kind through (kind, state) for each of
# rate_limited_due's ten probes (bench flow: 13 ms a turn, 770 blocks, instead of 0.4 ms and 25).
# Planning again costs one planning this often (the claim's: 9.5 ms on the sixth machine, 17 on the
# seventh); the table's size, read afresh each time, is enough for the planner to pick the partial
# indexes even before an analyze.
REPLAN_SECONDS = 10.0
# A run slower than this makes its statement be prepared again at its next run, at most once every
# REPLAN_AFTER_SLOW_SECONDS: a plan made on a table that has since grown is kept no longer than that
# when it costs (bench flow: rate_limited_due's plan made on the emptied table took 15-38 ms a run,
# about ten runs a second, until REPLAN_SECONDS passed; planned again, 0.1 ms). A run slow for
# another reason (a big claim, a lock wait, a loaded machine) costs one planning more at most that often.
SLOW_RUN_SECONDS = 0.005
REPLAN_AFTER_SLOW_SECONDS = 1.0


def run_prepared(
    cursor: Any,
    name: str,
    sql: str,
    params: Mapping[str, Any],
    types: Types,
    *,
    prefix: str = "",
    generic: bool = True,
    replan_when_slow: bool = False,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` as the server-side prepared statement ``name`` of ``cursor``'s session; its columns and rows.

    Prepared on the first run in that session (``types``: each parameter's SQL type), then only
    executed, with a generic plan (``GENERIC_PLAN``); prepared again every ``REPLAN_SECONDS``, so the
    plan follows the table, and with ``replan_when_slow`` sooner after a slow run (``SLOW_RUN_SECONDS``:
    for reads whose normal run is well under it; a claim or an outcome statement may be slow because
    it has many rows, not a stale plan). After a failure (or an interruption) the
    session's statements are deallocated and prepared again on their next run, so a session that
    lost one, or holds one a migration made stale, recovers at the next call instead of failing at
    every one.
    For a dedicated session (``locks.dedicated_connection``), or Django's own through
    ``run_prepared_here`` (never behind a pooler in transaction mode: the next transaction may run
    on a server session that never saw the ``PREPARE``; "Behind PgBouncer", docs/operations.md).
    ``prefix``: statements sent before the ``EXECUTE`` in the same query string (no parameters).
    ``generic`` false: no ``GENERIC_PLAN`` (its ``SET LOCAL`` would last for the rest of a caller's
    transaction); PostgreSQL then plans the first five runs for their parameters, and keeps its
    generic plan after them when it costs no more.
    """
    text, names = positional(sql)
    done = _prepared.get(cursor.connection)
    if done is None:
        # a session new to us, or one whose statements failed: it may hold statements we do not know
        # of (or not hold one we prepared): start again from none
        cursor.execute("DEALLOCATE ALL")
        done = _prepared[cursor.connection] = {}
    try:
        now = time.monotonic()
        if name not in done or now >= done[name] + REPLAN_SECONDS:
            declared = f" ({', '.join(types[n] for n in names)})" if names else ""
            again = f"DEALLOCATE {name};\n" if name in done else ""
            cursor.execute(f"{again}PREPARE {name}{declared} AS {text}")
            done[name] = now
        arguments = f" ({', '.join(['%s'] * len(names))})" if names else ""
        # one query string: in autocommit, one implicit transaction, which the SET LOCAL lasts for
        head = prefix.replace("%", "%%") + (GENERIC_PLAN if generic else "")
        started = time.monotonic()
        cursor.execute(f"{head}EXECUTE {name}{arguments}", [params[n] for n in names])
        if (
            replan_when_slow
            and time.monotonic() - started > SLOW_RUN_SECONDS
            and started >= done[name] + REPLAN_AFTER_SLOW_SECONDS
        ):
            done[name] = -math.inf  # prepared again at its next run
    except BaseException:  # a database error, or a stop (SystemExit) between a PREPARE and its record
        # The session and our list may disagree (a statement deallocated or prepared on another
        # server session behind a pooler; a plan whose result type a migration changed: "cached
        # plan must not change result type"), and a failure of any other kind costs little to
        # prepare again after: the next run deallocates everything and prepares what it runs.
        _prepared.pop(cursor.connection, None)
        raise
    if cursor.description is None:
        return [], []
    return [column[0] for column in cursor.description], cursor.fetchall()


# The SQL type of each parameter of a prepared statement, by name. Arrays whose elements may all be
# NULL are declared text[] (psycopg2 sends ARRAY[NULL] as text[]) and cast in the statement.
Types = Mapping[str, str]
_ORM_PREFIX = "tk_"  # the names of the statements prepared on Django's connection (run_prepared_here)
_orm_refused = False  # a server session did not know a statement this process prepared: a pooler (orm_prepares)
INVALID_STATEMENT_NAME = "26000"  # SQLSTATE: "prepared statement ... does not exist"
DUPLICATE_STATEMENT = "42P05"  # SQLSTATE: "prepared statement ... already exists" (a session we did not prepare)
CHANGED_RESULT_TYPE = "0A000"  # SQLSTATE of "cached plan must not change result type" (a migration since the PREPARE)


def orm_prepares() -> bool:
    """Whether statements are prepared on Django's own connection (``run_prepared_here``).

    Not behind a transaction pooler, where the next transaction may run on a server session that
    never saw the ``PREPARE``. Django's setting for such a pooler, ``DISABLE_SERVER_SIDE_CURSORS``
    (docs/operations.md, "Behind PgBouncer"; scheduling.W008 warns when a pooler is seen without
    it), turns it off; so does, for the rest of the process, a server session that did not know a
    statement this process had prepared, or knew one it had not (a pooler without that setting).
    Only with psycopg2, this project's driver.
    """
    return (
        not _orm_refused
        and not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
        and getattr(connection, "Database", None) is psycopg2  # psycopg 3 binds on the server, mogrify differs
    )


def run_prepared_here(
    name: str, sql: str, params: Params, types: Types, *, prefix: str = ""
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Statement ``name`` on Django's connection, in the caller's transaction if any: prepared when it may be.

    For the statements every batch runs: planning them was about half of what PostgreSQL spent on
    a batch of one job (bench flow). ``prefix`` (statements run first, in the same query string) may
    hold the statement's named parameters. Not prepared (``orm_prepares``): sent as text like any
    other. A session that does not know a statement this process prepared (or knows one it did not)
    marks the process and logs why; later statements are sent as text.
    A prepared run that fails in autocommit because of its preparing (a statement lost to a pooler,
    a plan whose result type a migration changed) ran nothing: it is sent again at once as text. Inside a caller's
    transaction the failure is the caller's, as any statement's (the transaction is aborted), and the
    statement is prepared again at its next run.
    """
    global _orm_refused
    assert isinstance(params, Mapping)
    if not orm_prepares():
        return run(prefix + sql, params)
    autocommit = connection.get_autocommit()
    with connection.cursor() as cursor:
        head = cursor.mogrify(prefix, params).decode() if "%(" in prefix else prefix
        try:
            return run_prepared(cursor, _ORM_PREFIX + name, sql, params, types, prefix=head, generic=autocommit)
        except DatabaseError as exc:
            code = getattr(exc.__cause__, "pgcode", None)
            if code in (INVALID_STATEMENT_NAME, DUPLICATE_STATEMENT):
                _orm_refused = True
                logger.warning(
                    "a prepared statement was missing from the server session, or there before it was prepared:"
                    " Django's connection goes through a transaction pooler; set DISABLE_SERVER_SIDE_CURSORS on it"
                    " (docs/operations.md, 'Behind PgBouncer'). Statements are no longer prepared in this process.",
                    extra={"statement": name, "action": "prepare_refused"},
                )
            if not autocommit or code not in (INVALID_STATEMENT_NAME, DUPLICATE_STATEMENT, CHANGED_RESULT_TYPE):
                raise
    return run(prefix + sql, params)


def rows_as(cls: type[R], columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[R]:
    """``rows`` of ``columns`` as ``cls`` instances, built by column name (as ``fetch_all_sql``)."""
    make: Callable[[Sequence[Any]], R] = _builder(cast(Hashable, cls), tuple(columns))
    return [make(row) for row in rows]


def run(sql: str, params: Params) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` (several statements joined: the rows are the last one's); its column names and rows."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.description is None:
            return [], []
        return [column[0] for column in cursor.description], cursor.fetchall()


def fetch_all_sql(cls: type[R], sql: str, params: Params) -> list[R]:
    """The rows of ``sql`` as ``cls`` instances, built by column name."""
    columns, rows = run(sql, params)
    make: Callable[[Sequence[Any]], R] = _builder(cast(Hashable, cls), tuple(columns))
    return [make(row) for row in rows]


def build(cls: type[R], record: Mapping[str, Any]) -> R:
    """A ``cls`` from {column: value}, by name (see the module docstring)."""
    columns = tuple(record)
    made: R = _builder(cast(Hashable, cls), columns)(tuple(record[c] for c in columns))
    return made


@functools.cache
def _fields(key: Hashable) -> dict[str, Any]:
    """{field name: converter or None} of a dataclass, from its resolved type hints."""
    cls = cast(type[Any], key)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    hints = typing.get_type_hints(cls, include_extras=True)
    return {field.name: _converter(hints[field.name]) for field in dataclasses.fields(cls)}


def _converter(hint: Any) -> Any:
    """What turns a column's value into the field's: an enum's constructor, a JSON decoder, or None."""
    if typing.get_origin(hint) is Annotated and _JSON in typing.get_args(hint)[1:]:
        return _decode_json
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _converter(inner[0]) if len(inner) == 1 else None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    return None


def _decode_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


@functools.cache
def _builder(key: Hashable, columns: tuple[str, ...]) -> Any:
    """A maker of ``key`` (a dataclass) instances from rows of ``columns``, built once per column list."""
    cls = cast(type[Any], key)
    fields = _fields(key)
    unknown = [column for column in columns if column not in fields]
    if unknown:
        raise ValueError(f"columns {unknown} have no field in {cls.__name__}")
    converters = [fields[column] for column in columns]

    def make(row: Sequence[Any]) -> Any:
        values = {
            column: convert(value) if convert is not None and value is not None else value
            for column, convert, value in zip(columns, converters, row, strict=True)
        }
        return cls(**values)

    return make
