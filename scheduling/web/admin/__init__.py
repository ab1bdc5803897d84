"""Timekeeper in the Django admin: one module per mechanism, registered on import.

- ``jobs``: scheduled jobs (list, a job's page, add, the bulk actions); forms in ``job_forms``.
- ``fixed``: fixed-time schedules (django-celery-beat's periodic tasks with the policy inline), their
  runs and the schedulers' heartbeats; forms in ``fixed_forms``.
- ``recurrences``: recurring per-entity work (read-only rows, bulk pause, resume, cancel).
- ``kinds``: pause, resume and cap a kind.
- ``tokens``: API tokens.
- ``audit``: the operators' audit trail (read-only, filterable; a job's History lists its records).
- ``common``: what they share (times to the second, the checked selection, form fields).

The admin holds no scheduling logic: it goes through the same door as application code
(``scheduling.api`` and the mechanisms' public functions) and never writes a row itself.

The dashboard shows on the admin index with no template in the host project: the default site's
``index_template`` (unless the project set its own) extends ``admin/index.html``, so a project
override of that template still applies underneath.
"""

from __future__ import annotations

from django.contrib import admin

from scheduling.web.admin import audit, fixed, jobs, kinds, recurrences, tokens  # noqa: F401 - each registers its admins

DASHBOARD_INDEX_TEMPLATE = "scheduling/admin/index.html"  # extends the project's admin/index.html, adds the dashboard

if admin.site.index_template is None:  # the project's own index template wins; it can add {% timekeeper_dashboard %}
    admin.site.index_template = DASHBOARD_INDEX_TEMPLATE
