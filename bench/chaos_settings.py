"""The project's settings plus the chaos soak's own kinds (``bench/chaoskinds``)."""

from project.settings import *  # noqa: F403 - the deployment's settings, unchanged

SCHEDULING_HANDLER_PACKAGES = ("bench.chaoskinds",)
