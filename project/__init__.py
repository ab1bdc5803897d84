"""Timekeeper's Django project; importing it loads the Celery app so shared tasks bind to it."""

from __future__ import annotations

from project.celery import app as celery_app

__all__ = ["celery_app"]
