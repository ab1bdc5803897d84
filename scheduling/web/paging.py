"""Pages of the JSON API's lists with bounded cost: a keyset ``cursor``, a capped ``page`` depth, a capped count.

Every list the API serves (``/api/jobs/``, ``/api/recurrences/``) reads its rows here (the kinds'
list is one row per registered kind and needs no pages). A page
costs at most ``page_size + 1`` rows past its starting point, whatever its depth:

- ``next`` is always a keyset link (``?cursor=...``): the next page starts after the last row of
  this one by the list's order (``(due_at, id)`` for jobs, ``id`` for recurrences), through an
  index range, never an ``OFFSET``. Walking ``next`` links visits every row that existed when the
  walk began exactly once, even while rows are inserted (a row inserted behind the cursor is not
  seen; none is seen twice).
- ``page=N`` stays for compatibility while ``(N - 1) * page_size`` is at most ``MAX_OFFSET_ROWS``;
  deeper is 400 ``page_too_deep`` (follow ``next`` instead).
- ``count`` counts at most ``MAX_COUNT`` rows (``SELECT count(*) FROM (... LIMIT MAX_COUNT + 1)``):
  ``count_exact`` is false, and ``pages`` null, when there are more.

A cursor is signed (``django.core.signing``) so a mangled one is a clear 400, not a database error.
docs/operations.md (the JSON APIs) describes the parameters for callers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from django.core import signing
from django.db.models import Q, QuerySet
from django.http import QueryDict

from scheduling.web import jobs_api

MAX_OFFSET_ROWS = 10_000  # rows: the deepest ``page=`` start; deeper pages take ``cursor=``
MAX_COUNT = 10_000  # rows: ``count`` is exact up to this, "at least" beyond (never below MAX_OFFSET_ROWS)
MAX_CURSOR_CHARACTERS = 300  # a cursor this module signed is well under this
CURSOR_SALT = "scheduling.web.paging.cursor"
PAGE_PARAMETERS = frozenset({"page", "page_size", "cursor"})


@dataclasses.dataclass(frozen=True)
class Order:
    """A list's order: the model fields, unique together, the last one the primary key (ascending)."""

    fields: tuple[str, ...]

    def key(self, row: Any) -> list[Any]:
        """The cursor value of ``row``: its order fields, date-times as ISO-8601 text."""
        return [_plain(getattr(row, name)) for name in self.fields]

    def after(self, values: Sequence[Any]) -> Q:
        """Rows after ``values``: for (a, id), ``a >= v_a AND (a > v_a OR id > v_id)``.

        The first comparison bounds an index range on the leading field (a bare OR of the two
        cases would be a filter read from the start of the range); the second skips the ties.
        """
        first, *rest = self.fields
        if not rest:
            return Q(**{f"{first}__gt": values[0]})
        return Q(**{f"{first}__gte": values[0]}) & (
            Q(**{f"{first}__gt": values[0]}) | Order(tuple(rest)).after(values[1:])
        )


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def _parsed(order: Order, values: Any) -> list[Any]:
    """The signed cursor's values back in their types (date-times for ``*_at`` fields)."""
    if not isinstance(values, list) or len(values) != len(order.fields):
        raise _bad_cursor()
    out: list[Any] = []
    for name, value in zip(order.fields, values, strict=True):
        if name.endswith("_at"):
            if not isinstance(value, str):
                raise _bad_cursor()
            out.append(dt.datetime.fromisoformat(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            out.append(value)
        else:
            raise _bad_cursor()
    return out


def _bad_cursor() -> jobs_api.ApiError:
    return jobs_api.ApiError(
        400, "invalid_cursor", "cursor is not one this API gave out; start again without it and follow next links."
    )


def encode_cursor(order: Order, row: Any) -> str:
    """The opaque, signed cursor that starts a page after ``row``."""
    return signing.dumps(order.key(row), salt=CURSOR_SALT)


def decode_cursor(order: Order, text: str) -> list[Any]:
    """The order values a cursor holds; 400 ``invalid_cursor`` for anything this module did not sign."""
    if len(text) > MAX_CURSOR_CHARACTERS:
        raise _bad_cursor()
    try:
        return _parsed(order, signing.loads(text, salt=CURSOR_SALT))
    except (signing.BadSignature, ValueError, TypeError):
        raise _bad_cursor() from None


def bounded_count(rows: QuerySet[Any]) -> tuple[int, bool]:
    """How many rows match, counting at most ``MAX_COUNT + 1``: (count, exact)."""
    counted = rows.order_by()[: MAX_COUNT + 1].count()
    return min(counted, MAX_COUNT), counted <= MAX_COUNT


def page(
    request_path: str,
    params: QueryDict,
    rows: QuerySet[Any],
    fields: tuple[str, ...],
    render: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:
    """One page of ``rows`` ordered by ``fields`` as the API's list body (``count``, ``next``, ``results``, ...).

    ``fields`` are unique together and ascending, the last one the primary key.

    400 for a bad ``page``/``page_size``/``cursor``, a ``page`` past ``MAX_OFFSET_ROWS``, or both
    ``page`` and ``cursor``; 404 for a ``page`` past the last one.
    """
    page_size = jobs_api._positive_int(
        params.get("page_size", str(jobs_api.DEFAULT_PAGE_SIZE)), "page_size", jobs_api.MAX_PAGE_SIZE
    )
    order = Order(fields)
    ordered = rows.order_by(*fields)
    number: int | None = None
    if "cursor" in params:
        if "page" in params:
            raise jobs_api.ApiError(400, "invalid_parameter", "Give page or cursor, not both.")
        window = ordered.filter(order.after(decode_cursor(order, str(params["cursor"]))))
    else:
        number = jobs_api._positive_int(params.get("page", "1"), "page", 10**6)
        offset = (number - 1) * page_size
        if offset > MAX_OFFSET_ROWS:
            raise jobs_api.ApiError(
                400,
                "page_too_deep",
                f"page {number} of {page_size} starts past row {MAX_OFFSET_ROWS}, the deepest a page number "
                "reaches; follow the next links (cursor=) to go further.",
                max_offset_rows=MAX_OFFSET_ROWS,
            )
        window = ordered[offset:] if offset else ordered
    fetched = list(window[: page_size + 1])
    shown, more = fetched[:page_size], len(fetched) > page_size
    count, exact = bounded_count(rows)
    pages = max(1, -(-count // page_size)) if exact else None
    if number is not None and number > 1 and not shown:
        raise jobs_api.ApiError(404, "no_such_page", f"Page {number} is past the last page ({pages}).")

    def link(**changes: str) -> str:
        query = params.copy()
        for name in ("page", "cursor"):
            query.pop(name, None)
        query.update(changes)
        return f"{request_path}?{query.urlencode()}"

    return {
        "count": count,
        "count_exact": exact,
        "page": number,
        "pages": pages,
        "page_size": page_size,
        "next": link(cursor=encode_cursor(order, shown[-1])) if more else None,
        "previous": link(page=str(number - 1)) if number is not None and number > 1 else None,
        "results": [render(row) for row in shown],
    }
