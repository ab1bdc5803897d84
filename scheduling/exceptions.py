"""Public path of Timekeeper's exceptions (defined in ``scheduling.core.exceptions``)."""

from scheduling.core.exceptions import *  # noqa: F403 - the public names, listed in its __all__
from scheduling.core.exceptions import __all__  # noqa: F401
