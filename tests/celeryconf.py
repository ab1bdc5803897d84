"""Change Celery's own configuration for one test (``override_settings`` does not reach ``app.conf``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from celery import current_app


@contextlib.contextmanager
def override_celery(**values: Any) -> Iterator[None]:
    """Set ``current_app.conf`` keys (``broker_transport_options=...``) inside the block, restored after it."""
    conf = current_app.conf
    previous = {name: conf.get(name) for name in values}
    conf.update(values)
    try:
        yield
    finally:
        conf.update(previous)
