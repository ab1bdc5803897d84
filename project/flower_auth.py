"""Flower's ``/metrics`` behind Flower's own authentication (``FLOWER_BASIC_AUTH`` or OAuth).

Flower 2.x puts ``@tornado.web.authenticated`` on its pages and API, but not on ``/metrics``
(``flower.views.monitor.Metrics``): with ``--basic-auth`` set, anyone who reaches the port still
reads the Prometheus text (worker names, task names and counts). Flower has no option for it, so
``flowerconfig.py`` (Flower's configuration file, which it executes at start; ``dev.py run`` and the
compose file pass it with ``--conf``) calls ``protect_metrics()`` before Flower serves anything.
``/healthcheck`` stays open: it answers "OK" and nothing else, for probes.
"""

from __future__ import annotations

from typing import Any

from flower.views import monitor
from tornado import web


def protect_metrics() -> None:
    """Wrap ``Metrics.get`` in ``web.authenticated``: no or wrong basic-auth credentials are a 401 (idempotent)."""
    current: Any = monitor.Metrics.get
    if getattr(current, "timekeeper_protected", False):
        return
    protected: Any = web.authenticated(current)
    protected.timekeeper_protected = True
    monitor.Metrics.get = protected
