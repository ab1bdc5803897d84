"""Timekeeper's HTTP surface: the jobs JSON API, its token authentication and the admin dashboard.

``/metrics`` and ``/healthz`` live in ``scheduling.metrics`` and ``scheduling.health``.
"""
