"""URLs of the kinds API, included under ``api/kinds/`` with the namespace ``kinds-api``."""

from __future__ import annotations

from django.urls import path

from scheduling.web import kinds_api

app_name = "kinds-api"

urlpatterns = [
    path("", kinds_api.collection, name="collection"),
    path("<str:kind>/pause", kinds_api.pause, name="pause"),
    path("<str:kind>/resume", kinds_api.resume, name="resume"),
    *(path(f"<str:kind>/{verb}", view, name=verb) for verb, view in kinds_api.SETTERS.items()),  # cap, ...
    path("<str:kind>/rate", kinds_api.rate, name="rate"),  # a rate is not a scalar option: its own door
]
