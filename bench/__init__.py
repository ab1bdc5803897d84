"""Timekeeper's benchmarks: ``python -m bench <scenario>`` or ``python -m bench all [--quick]``.

Every scenario measures the platform and its baselines in the same run on the same machine, prints
a table, writes ``bench/results/<scenario>.json`` (and a PNG where a chart reads better), and
prints that JSON object as its last line. The benchmark runs on its own database
(``timekeeper_bench``) and Redis database (14), and starts real Celery processes.

Scenario contract (``bench/memory.py`` and the others follow it): a module with
``main(quick: bool = False) -> dict`` that prints its table, and returns the figures; the caller
(``bench.common.emit``) writes the JSON file and prints the JSON line. A module may call ``emit``
itself and return its result: ``emit`` is idempotent per scenario name.

This module imports nothing heavy: the Procrastinate baseline imports ``bench.procrastinate_app``
from a separate virtualenv that has neither Django nor psycopg2.
"""
