"""Change Celery's own configuration for one test (``override_settings`` does not reach ``app.conf``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from celery import current_app


@contextlib.contextmanager
def override_celery(**values: Any) -> Iterator[None]:
    """Set ``current_app.conf`` keys (``broker_transport_options=...``) inside the block, restored after it.

    Restored means as before: a key the block added to Celery's own layer of changes is removed
    again (not set to the value it read), so that afterwards ``app.conf`` reads the Django settings
    live once more, and a later test's ``settings.CELERY_...`` override still reaches it.
    """
    conf = current_app.conf
    changes = conf.changes
    previous = {name: changes[name] for name in values if name in changes}
    conf.update(values)
    try:
        yield
    finally:
        for name in values:
            if name in previous:
                changes[name] = previous[name]
            else:
                changes.pop(name, None)
