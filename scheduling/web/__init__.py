"""The doors people use: the Django admin and its dashboard, the JSON jobs API, ``/metrics`` and
``/healthz``. They act through ``scheduling.api`` and the mechanisms, never on tables directly."""
