"""Helpers for the worker fault tests: test job kinds, worker settings, measurements.

- ``kinds``: a handler package with job kinds that hold, crash or kill their own process; workers
  load it through ``worker_settings`` and the test process by importing ``kinds.handlers``.
- ``worker_settings``: the project's settings plus that package, for the processes tests start.
- ``measure``: the database clock, and the measured recovery times written to
  ``tests/artifacts/faults.json`` (docs/fault-tolerance.md's table is built from it).
"""
