"""Settings for the worker and beat processes the fault tests start: the project's, plus the test kinds."""

from __future__ import annotations

from project.settings import *  # noqa: F403 - these are the project's settings with two additions

SCHEDULING_HANDLER_PACKAGES = ["tests.faultkit.kinds"]  # besides tasks/jobs.py, found as an installed app's
