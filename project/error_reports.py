"""What Django's error page and error e-mails may show: Django's filter, plus passwords inside URLs.

Django hides settings and request headers whose *name* looks secret (``PASS``, ``KEY``, ``AUTH``...),
but ``DATABASE_URL``, ``CELERY_BROKER_URL`` and ``CELERY_RESULT_BACKEND`` carry a password in their
*value*, and under ``runserver`` the whole environment is in ``request.META``. This filter runs every
string it lets through (settings, META entries, local variables of the traceback's frames) through
``redaction.redact``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import Promise
from django.views.debug import SafeExceptionReporterFilter

from project import redaction


class ExceptionReporterFilter(SafeExceptionReporterFilter):
    """``SafeExceptionReporterFilter`` that also hides passwords in URLs (``DEFAULT_EXCEPTION_REPORTER_FILTER``)."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        """Django's cleansing by name, then passwords in URL strings (dicts, lists and tuples recurse here)."""
        value = super().cleanse_setting(key, value)
        # Lazy text (gettext_lazy, django-axes' messages) is text too: str() it before the regex sees it.
        return redaction.redact(str(value)) if isinstance(value, str | Promise) else value

    def get_traceback_frame_variables(self, request: HttpRequest | None, tb_frame: Any) -> Any:
        """Each frame's variables with passwords in URLs hidden, and dict entries hidden by name (``PASSWORD``).

        Also with ``DEBUG`` on, where Django shows variables as they are: a developer's page may
        still be read over a shoulder or pasted into an issue, and DATABASE_URL may be a real one.
        The variable's own name is not judged: a local called ``key`` is a job key, not a secret.
        """
        variables = super().get_traceback_frame_variables(request, tb_frame)
        return [(name, self.cleanse_setting("", value)) for name, value in variables]
