"""The demo product's pages, included under ``trials/`` with the namespace ``tasks``."""

from __future__ import annotations

from django.urls import path

from tasks import views

app_name = "tasks"

urlpatterns = [
    path("", views.trial_list, name="trial-list"),
    path("start", views.trial_start, name="trial-start"),
    path("<int:trial_id>/", views.trial_detail, name="trial-detail"),
    path("<int:trial_id>/upgrade", views.trial_upgrade, name="trial-upgrade"),
    path("<int:trial_id>/end", views.trial_change_end, name="trial-change-end"),
]
