"""URLs of the recurrences API, included under ``api/recurrences/`` with the namespace ``recurrences-api``."""

from __future__ import annotations

from django.urls import path

from scheduling.web import recurrences_api
from scheduling.web import urls as jobs_urls  # registers the "jobid" converter (digits, at most 20)

app_name = "recurrences-api"

CONVERTER = jobs_urls.JobIdConverter  # the "jobid" converter, registered by that module

urlpatterns = [
    path("", recurrences_api.collection, name="collection"),
    path("<jobid:recurrence_id>", recurrences_api.detail, name="detail"),
    path("<jobid:recurrence_id>/pause", recurrences_api.pause, name="pause"),
    path("<jobid:recurrence_id>/resume", recurrences_api.resume, name="resume"),
    path("<jobid:recurrence_id>/cancel", recurrences_api.cancel, name="cancel"),
    path("<jobid:recurrence_id>/next", recurrences_api.upcoming, name="next"),
]
