"""The jobs API's OpenAPI document: valid OpenAPI 3, served at /api/jobs/openapi.json, and true to the URLs."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import get_resolver
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

from scheduling.web import jobs_api, kinds_api, openapi

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
    """Each route under api/jobs/ and api/kinds/ appears in the document's paths, and nothing else does."""
    resolver = get_resolver()
    documented = set(openapi.document()["paths"])
    routes = set()
    for pattern in resolver.url_patterns:
        if str(pattern.pattern) not in {"api/jobs/", "api/kinds/"}:
            continue
        for inner in pattern.url_patterns:
            route = str(inner.pattern).replace("<jobid:job_id>", "{job_id}").replace("<str:kind>", "{kind}")
            routes.add(f"/{pattern.pattern}{route}")
    assert routes == documented


def test_create_fields_match_the_view():
    """The create and reschedule bodies list exactly the fields the view accepts."""
    schemas = openapi.document()["components"]["schemas"]
    assert set(schemas["CreateJob"]["properties"]) == jobs_api.CREATE_FIELDS
    assert set(schemas["Reschedule"]["properties"]) == jobs_api.RESCHEDULE_FIELDS
    assert set(schemas["Cap"]["properties"]) == kinds_api.CAP_FIELDS


def test_kind_answers_match_the_document(admin_client: Any):
    """The kinds API's list and a pause answer validate against the Kind schemas of the document."""
    document = openapi.document()

    def check(value: Any, name: str) -> None:
        schema = {**document["components"]["schemas"][name], "components": document["components"]}
        OAS30Validator(schema).validate(value)  # raises on the first difference

    listed = admin_client.get("/api/kinds/")
    assert listed.status_code == 200
    check(listed.json(), "KindList")
    paused = admin_client.post("/api/kinds/demo.noop/pause", "", content_type="application/json")
    assert paused.status_code == 200
    check(paused.json(), "Kind")
    assert paused.json()["paused"] is True


def test_the_limits_answers_are_documented_and_match_it(django_user_model: Any, client: Any, settings: Any):
    """createJob lists 429 with Retry-After; a real 429 and a real over_limit 400 validate against Error."""
    document = openapi.document()
    create = document["paths"]["/api/jobs/"]["post"]["responses"]
    assert "Retry-After" in create["429"]["headers"]
    error_schema = {**document["components"]["schemas"]["Error"], "components": document["components"]}
    client.force_login(django_user_model.objects.create_user("limited", password="pw"))
    settings.SCHEDULING_API_CREATE_BURST = 1
    body = '{"kind": "demo.noop", "delay": 5, "priority": 9}'
    over = client.post("/api/jobs/", body, content_type="application/json")
    assert (over.status_code, over.json()["error"]["code"]) == (400, "over_limit")
    OAS30Validator(error_schema).validate(over.json())
    limited = client.post("/api/jobs/", body, content_type="application/json")
    assert (limited.status_code, limited.json()["error"]["code"]) == (429, "rate_limited")
    assert int(limited["Retry-After"]) >= 1
    OAS30Validator(error_schema).validate(limited.json())
