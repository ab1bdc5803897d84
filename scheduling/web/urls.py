"""URLs of the jobs API, included under ``api/jobs/`` with the namespace ``jobs-api``."""

from __future__ import annotations

from django.urls import path, register_converter

from scheduling.web import jobs_api, openapi


class JobIdConverter:
    """A job id: digits only, at most 20 of them (a bigint has 19; larger ones are a 404 in the view)."""

    regex = "[0-9]{1,20}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(JobIdConverter, "jobid")

app_name = "jobs-api"

urlpatterns = [
    path("", jobs_api.collection, name="collection"),
    path("openapi.json", openapi.openapi_json, name="openapi"),
    path("<jobid:job_id>", jobs_api.detail, name="detail"),
    path("<jobid:job_id>/cancel", jobs_api.cancel, name="cancel"),
    path("<jobid:job_id>/reschedule", jobs_api.reschedule, name="reschedule"),
    path("<jobid:job_id>/abort", jobs_api.abort, name="abort"),
]
