"""Public path of the kind registry: ``handler``, ``Job``, ``Backoff`` (``scheduling.core.registry``)."""

from scheduling.core.registry import *  # noqa: F403 - the public names, listed in its __all__
from scheduling.core.registry import __all__  # noqa: F401
