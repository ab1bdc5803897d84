"""URLs of the jobs API, included under ``api/jobs/`` with the namespace ``jobs-api``."""

from __future__ import annotations

from django.urls import path, register_converter

from scheduling.http import jobs


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
    path("", jobs.collection, name="collection"),
    path("<jobid:job_id>", jobs.detail, name="detail"),
    path("<jobid:job_id>/cancel", jobs.cancel, name="cancel"),
    path("<jobid:job_id>/reschedule", jobs.reschedule, name="reschedule"),
]
