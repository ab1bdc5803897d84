"""URLs of the test views that enqueue Django tasks and read their results."""

from __future__ import annotations

from django.urls import path

from tests.taskkit import views

urlpatterns = [
    path("tasks/<str:name>/", views.enqueue),
    path("tasks/<str:name>/<str:result_id>", views.result),
]
