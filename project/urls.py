"""Timekeeper's URLs: the admin, the jobs API, the demo product pages, /metrics, /healthz, /livez and /readyz."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from scheduling.web import health, metrics, probes

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/jobs/", include("scheduling.web.urls")),
    path("api/kinds/", include("scheduling.web.kinds_urls")),
    path("api/recurrences/", include("scheduling.web.recurrences_urls")),
    path("trials/", include("tasks.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # No trailing slash: SECURE_REDIRECT_EXEMPT matches these exact paths (scraped over plain HTTP).
    path("metrics", metrics.metrics, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    path("livez", probes.livez, name="livez"),
    path("readyz", probes.readyz, name="readyz"),
    path("", RedirectView.as_view(pattern_name="tasks:trial-list", permanent=False)),
]
