"""Error reports that do not leak credentials: URLs with a password are masked on the debug page."""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

_CREDENTIAL_URL = re.compile(r"^[a-z][a-z0-9+.\-]*://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)


class MaskingExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, plus: settings named like ``*_URL`` and any value that is a URL with a password."""

    hidden_settings = re.compile(SafeExceptionReporterFilter.hidden_settings.pattern + "|URL", flags=re.IGNORECASE)

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        if isinstance(value, str) and _CREDENTIAL_URL.match(value):
            return self.cleansed_substitute
        return super().cleanse_setting(key, value)
