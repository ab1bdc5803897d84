"""Settings for the workers the Tasks backend's e2e tests start: the project's, plus the test tasks."""

from __future__ import annotations

from project.settings import *  # noqa: F403 - the project's settings with one addition

SCHEDULING_HANDLER_PACKAGES = ["tests.taskkit"]  # tests/taskkit/tasks.py: its @task functions become kinds
