"""The per-kind options declared once (``scheduling.core.kind_options``): checks, every door drawn from the table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from scheduling.core import exceptions, kind_options
from scheduling.due_at import api as jobs_api
from scheduling.management import kinds_cli
from scheduling.web import kinds_api, openapi
from scheduling.web.admin import kinds as kinds_admin

ROOT = Path(kind_options.__file__).parents[2]
CAP = kind_options.BY_NAME["max_running"]
RATE = kind_options.KindOption(
    name="rate",
    verb="rate",
    noun="rate",
    label="rate (jobs/s)",
    help="At most this many of the kind's jobs started per second; null: no limit.",
    summary="Limit how many of a kind's jobs start per second, cluster-wide.",
    shows="at most {value} started per second",
    unset="no limit",
    done="rate-limited",
    minimum=0.001,
    maximum=100_000,
    type=float,
)


def test_check_takes_values_in_bounds_and_none_and_refuses_the_rest_naming_the_bounds():
    """A whole number 1..1,000,000 or None passes the cap; 0, a bool, text or a float are InvalidSchedule."""
    assert CAP.check(1) == 1
    assert CAP.check(None) is None
    for bad in (0, 1_000_001, True, "3", 2.5, 10**500, 10**5000):  # math.isfinite() overflows; str() refuses 10**5000
        with pytest.raises(exceptions.InvalidSchedule, match="max_running must be a whole number from 1 to 1000000"):
            CAP.check(bad)
    assert RATE.check(2.5) == 2.5
    with pytest.raises(exceptions.InvalidSchedule, match=r"rate must be a number from 0\.001 to 100000"):
        RATE.check(float("inf"))


def test_parse_and_describe_read_and_say_a_value_as_a_person_does():
    """'none' unsets; digits parse; a value reads as a sentence, None as what unset means."""
    assert (CAP.parse("none"), CAP.parse("7")) == (None, 7)
    for bad in ("-1", "zero", "12345678"):
        with pytest.raises(ValueError, match=re.escape(bad)):
            CAP.parse(bad)
    assert (CAP.describe(3), CAP.describe(None)) == ("at most 3 running at once", "no cap")
    assert RATE.parse("0.5") == 0.5


def test_every_door_draws_its_options_from_the_one_table():
    """Each option has its API endpoint, admin form, CLI verb, OpenAPI path and schema, and overview key."""
    parser = argparse.ArgumentParser()
    kinds_cli.add_arguments(parser)  # type: ignore[arg-type]
    document = openapi.document()
    for option in kind_options.KIND_OPTIONS:
        assert option.verb in kinds_api.SETTERS
        assert list(kinds_admin.OPTION_FORMS[option.verb].base_fields) == [option.name]
        assert parser.parse_args([option.verb, "demo.noop", "none"]).value == "none"
        assert f"/api/kinds/{{kind}}/{option.verb}" in document["paths"]
        schemas = document["components"]["schemas"]
        assert schemas[option.noun.capitalize()]["required"] == [option.name]
        assert option.name in schemas["Kind"]["properties"]
        assert option.name in jobs_api.KindOverview.json_names()


def test_an_options_name_is_written_only_where_a_new_option_must_be():
    """Outside the table, the model, its SQL (kinds.sql, claim.sql) and named legacy spots, no code spells an option."""
    allowed = {
        "scheduling/core/kind_options.py",  # the table
        "scheduling/models/due_at.py",  # the column
        "scheduling/due_at/sql/kinds.sql",  # the setter's column lists
        "scheduling/due_at/sql/claim.sql",  # where the cap acts
        # legacy, not needed by a new option: the public set_max_running, the rows' max_running property,
        # the jobs page's "waits for a free place" line (the cap's own effect), the API's documented body.
        "scheduling/due_at/api.py",
        "scheduling/due_at/store.py",
        "scheduling/web/admin/jobs.py",
        "scheduling/web/kinds_api.py",
    }
    words = re.compile(r"\b(" + "|".join(re.escape(o.name) for o in kind_options.KIND_OPTIONS) + r")\b")
    spelled = set()
    for root in ("scheduling", "tasks"):
        for path in (ROOT / root).rglob("*"):
            code = path.suffix in {".py", ".sql", ".html"} and "migrations" not in path.parts
            if code and words.search(path.read_text()):
                spelled.add(path.relative_to(ROOT).as_posix())
    assert spelled <= allowed, sorted(spelled - allowed)
