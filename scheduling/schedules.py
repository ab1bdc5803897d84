"""Public path of fixed-time declarations: ``declare`` (``scheduling.fixed.declarations``)."""

from scheduling.fixed.declarations import *  # noqa: F403 - the public names, listed in its __all__
from scheduling.fixed.declarations import __all__  # noqa: F401
