"""gunicorn's configuration for the web service (``gunicorn --config=python:project.gunicorn_conf``).

The settings and both servers are checked before gunicorn binds or starts a worker, as for every
other command: a wrong or unreachable setting is one line naming it and exit status 78, not a
traceback from each worker.
"""

from __future__ import annotations

from typing import Any

from project import preflight


def on_starting(server: Any) -> None:
    """Run the one-line settings check in gunicorn's master process, first."""
    preflight.main()
