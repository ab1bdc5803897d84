"""Django's admin autodiscovery imports ``<app>.admin``: the admin lives in ``scheduling.web.admin``."""

from scheduling.web import admin  # noqa: F401 - registers the model admins on import
