"""Settings for the failures scenario's worker: the project's, plus the benchmark's job kinds."""

from __future__ import annotations

from project.settings import *  # noqa: F403 - the project's settings with one addition

SCHEDULING_HANDLER_PACKAGES = ["bench.kinds"]
