"""The jobs API's OpenAPI document: valid OpenAPI 3, served at /api/jobs/openapi.json, and true to the URLs."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import get_resolver
from openapi_spec_validator import validate

from scheduling.web import jobs_api, openapi

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]


def test_document_is_valid_openapi_3():
    """openapi-spec-validator accepts the document (schemas, refs, links, security schemes)."""
    validate(openapi.document())


def test_document_is_served_without_credentials(client: Any):
    """GET /api/jobs/openapi.json answers the same document as JSON to an anonymous caller."""
    response = client.get("/api/jobs/openapi.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == openapi.document()


def test_every_jobs_api_route_is_documented():
    """Each route under api/jobs/ appears in the document's paths, and nothing else does."""
    resolver = get_resolver()
    documented = set(openapi.document()["paths"])
    routes = set()
    for pattern in resolver.url_patterns:
        if str(pattern.pattern) != "api/jobs/":
            continue
        for inner in pattern.url_patterns:
            route = str(inner.pattern).replace("<jobid:job_id>", "{job_id}")
            routes.add(f"/api/jobs/{route}")
    assert routes == documented


def test_create_fields_match_the_view():
    """The create and reschedule bodies list exactly the fields the view accepts."""
    schemas = openapi.document()["components"]["schemas"]
    assert set(schemas["CreateJob"]["properties"]) == jobs_api.CREATE_FIELDS
    assert set(schemas["Reschedule"]["properties"]) == jobs_api.RESCHEDULE_FIELDS
