"""The OpenAPI document of /api/ (jobs, kinds, recurrences): valid, served, true to the URLs and to real answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.urls import get_resolver
from jsonschema.exceptions import ValidationError
from openapi_schema_validator import OAS30Validator, oas30_format_checker
from openapi_spec_validator import validate

from scheduling import api
from scheduling.core import kind_options
from scheduling.models import Recurrence
from scheduling.web import jobs_api, openapi, recurrences_api

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


def test_every_api_route_is_documented():
    """Each route under api/jobs/, api/kinds/ and api/recurrences/ appears in the document's paths, and no other."""
    resolver = get_resolver()
    documented = set(openapi.document()["paths"])
    routes = set()
    for pattern in resolver.url_patterns:
        if str(pattern.pattern) not in {"api/jobs/", "api/kinds/", "api/recurrences/"}:
            continue
        for inner in pattern.url_patterns:
            route = str(inner.pattern).replace("<jobid:job_id>", "{job_id}").replace("<str:kind>", "{kind}")
            routes.add(f"/{pattern.pattern}{route.replace('<jobid:recurrence_id>', '{recurrence_id}')}")
    assert {r for r in routes if r.startswith("/api/recurrences/")}, "the recurrences' routes were found"
    assert routes == documented


def test_create_fields_match_the_view():
    """The create and reschedule bodies list exactly the fields the view accepts."""
    schemas = openapi.document()["components"]["schemas"]
    assert set(schemas["CreateJob"]["properties"]) == jobs_api.CREATE_FIELDS
    assert set(schemas["Reschedule"]["properties"]) == jobs_api.RESCHEDULE_FIELDS
    assert set(schemas["Cap"]["properties"]) == {kind_options.BY_VERB["cap"].name}


def test_recurrence_fields_match_the_view():
    """The recurrence bodies, the list's parameters and the answer list exactly the fields the views use."""
    document = openapi.document()
    schemas = document["components"]["schemas"]
    assert set(schemas["CreateRecurrence"]["properties"]) == recurrences_api.CREATE_FIELDS
    assert set(schemas["ChangeRecurrence"]["properties"]) == recurrences_api.CHANGE_FIELDS
    listed = document["paths"]["/api/recurrences/"]["get"]["parameters"]
    assert {p["name"] for p in listed} == recurrences_api.LIST_PARAMETERS
    recurrence = api.recur("demo.noop", {}, key="fields", cron="0 9 * * *", timezone="Europe/Lisbon")
    shown = recurrences_api.recurrence_json(recurrence, upcoming=1)
    assert set(schemas["Recurrence"]["properties"]) == set(shown)
    assert set(schemas["Recurrence"]["required"]) == set(shown) - {"next_occurrences"}


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


def documented_schema(document: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    """The JSON schema the document gives for ``method path`` answering ``status`` (refs resolvable)."""
    answer = document["paths"][path][method]["responses"][str(status)]
    return {**answer["content"]["application/json"]["schema"], "components": document["components"]}


def conforms(document: dict[str, Any], path: str, method: str, response: Any) -> None:
    """``response`` has a documented status, and its body validates against that status's schema (formats too)."""
    assert str(response.status_code) in document["paths"][path][method]["responses"], (
        path,
        method,
        response.status_code,
    )
    schema = documented_schema(document, path, method, response.status_code)
    OAS30Validator(schema, format_checker=oas30_format_checker).validate(response.json())


def test_every_recurrence_operation_answers_as_documented(django_user_model: Any, client: Any):
    """Each documented recurrence operation, called for real, answers a documented status with a body that validates."""
    document = openapi.document()
    client.force_login(django_user_model.objects.create_user("recurrer", password="pw"))
    one = "/api/recurrences/{recurrence_id}"
    called: set[str] = set()

    def call(method: str, path: str, url: str, body: str | None = None, **query: Any) -> Any:
        send = getattr(client, method)
        response = send(url, body, content_type="application/json") if body is not None else send(url, query)
        conforms(document, path, method, response)
        called.add(document["paths"][path][method]["operationId"])
        return response

    body = '{"kind": "demo.noop", "key": "digest:1", "cron": "30 1 * * *", "timezone": "Europe/Lisbon", "payload": {}}'
    created = call("post", "/api/recurrences/", "/api/recurrences/", body)
    assert (created.status_code, created.json()["outcome"]) == (201, "created")
    url = created.json()["recurrence"]["url"]
    assert created["Location"] == url
    replaced = call("post", "/api/recurrences/", "/api/recurrences/", body.replace("30 1", "0 2"))
    assert (replaced.status_code, replaced.json()["outcome"]) == (200, "replaced")
    conflict = body[:-1] + ', "on_conflict": "error"}'
    assert call("post", "/api/recurrences/", "/api/recurrences/", conflict).status_code == 409
    every = '{"kind": "demo.noop", "key": "every", "every": 3600, "ends_at": "2031-01-01T00:00:00+00:00"}'
    assert call("post", "/api/recurrences/", "/api/recurrences/", every).json()["recurrence"]["cron"] is None
    page = call("get", "/api/recurrences/", "/api/recurrences/", page_size="1")
    assert (page.json()["count"], page.json()["pages"]) == (2, 2)
    assert call("get", "/api/recurrences/", "/api/recurrences/", page="9").status_code == 404
    assert call("get", "/api/recurrences/", "/api/recurrences/", state="lost").status_code == 400
    assert len(call("get", one, url).json()["next_occurrences"]) == recurrences_api.DETAIL_NEXT
    assert call("get", one, "/api/recurrences/99999999").status_code == 404
    changed = call("patch", one, url, '{"every": 600, "cron": null, "priority": 0}')
    assert (changed.json()["every"], changed.json()["priority"]) == (600.0, 0)  # 0: the kind's caller bound
    assert call("patch", one, url, '{"every": 0}').status_code == 400
    upcoming = call("get", f"{one}/next", f"{url}/next", n="3")
    assert len(upcoming.json()["next_occurrences"]) == 3
    assert call("get", f"{one}/next", f"{url}/next", n="101").status_code == 400
    assert call("post", f"{one}/pause", f"{url}/pause", "").json()["state"] == "paused"
    assert call("post", f"{one}/resume", f"{url}/resume", "{}").json()["state"] == "active"
    assert call("post", f"{one}/cancel", f"{url}/cancel", "").json()["state"] == "cancelled"
    assert call("post", f"{one}/resume", f"{url}/resume", "").status_code == 409
    documented = {
        operation["operationId"]
        for path, item in document["paths"].items()
        if path.startswith("/api/recurrences/")
        for method, operation in item.items()
        if method in {"get", "post", "patch"}
    }
    assert called == documented


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("post", "", '{"kind": "demo.noop", "key": "x", "every": 60, "color": "red"}'),
        ("patch", "{id}", '{"every": 60, "owner": 1}'),
        ("post", "{id}/pause", '{"force": true}'),
    ],
)
def test_undocumented_fields_are_refused(admin_client: Any, method: str, suffix: str, body: str):
    """A body field the document does not list is a 400 unknown_field (an Error) and the recurrence is unchanged."""
    document = openapi.document()
    recurrence = api.recur("demo.noop", {}, key="kept", every=3600)
    before = Recurrence.objects.values().get(pk=recurrence.id)
    url = f"/api/recurrences/{suffix.format(id=recurrence.id)}"
    response = getattr(admin_client, method)(url, body, content_type="application/json")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "unknown_field")
    path = "/api/recurrences/" + suffix.replace("{id}", "{recurrence_id}")
    conforms(document, path, method, response)
    assert Recurrence.objects.values().get(pk=recurrence.id) == before
    assert Recurrence.objects.count() == 1


def test_the_recurrence_schema_refuses_undocumented_answer_fields():
    """The documented answer is closed: a recurrence with a field the document does not list fails validation."""
    document = openapi.document()
    schema = {**document["components"]["schemas"]["Recurrence"], "components": document["components"]}
    shown = json.loads(
        json.dumps(
            recurrences_api.recurrence_json(api.recur("demo.noop", {}, key="c", every=60)), cls=DjangoJSONEncoder
        )
    )
    OAS30Validator(schema, format_checker=oas30_format_checker).validate(shown)
    with pytest.raises(ValidationError, match="Additional properties"):
        OAS30Validator(schema).validate({**shown, "anchor_at": shown["created_at"]})


@pytest.mark.parametrize(
    "body",
    [
        '{"kind": "demo.noop", "key": "k", "every": 1e300}',
        '{"kind": "demo.noop", "key": "k", "every": 4e9}',
        '{"kind": "demo.noop", "key": "k", "cron": "0 9 * * *", "starts_at": "9999-12-31T23:59:59-14:00"}',
        '{"kind": "demo.noop", "key": "k", "cron": "0 9 * * *", "ends_at": "0001-01-01T00:00:00+14:00"}',
    ],
)
def test_out_of_range_rules_are_a_400_not_a_server_error(admin_client: Any, body: str):
    """An interval over ten years or an instant outside 2000..ten years ahead is refused (they overflowed: 500)."""
    response = admin_client.post("/api/recurrences/", body, content_type="application/json")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_schedule")
    assert not Recurrence.objects.exists()


def test_kind_operations_answer_as_documented(admin_client: Any):
    """Resume and cap (and their 400 and 404) answer documented statuses with bodies that validate."""
    document = openapi.document()
    cases = [
        ("/api/kinds/{kind}/resume", "/api/kinds/demo.noop/resume", "", 200),
        ("/api/kinds/{kind}/cap", "/api/kinds/demo.noop/cap", '{"max_running": 3}', 200),
        ("/api/kinds/{kind}/cap", "/api/kinds/demo.noop/cap", '{"max_running": 0}', 400),
        ("/api/kinds/{kind}/cap", "/api/kinds/no.such/cap", '{"max_running": 3}', 404),
        ("/api/kinds/{kind}/pause", "/api/kinds/demo.noop/pause", '{"extra": 1}', 400),
    ]
    for path, url, body, status in cases:
        response = admin_client.post(url, body, content_type="application/json")
        assert response.status_code == status, (url, body)
        conforms(document, path, "post", response)


def test_list_pages_answer_as_documented(django_user_model: Any, client: Any):
    """Numbered, cursor and too-deep pages of both lists validate against JobPage, RecurrencePage and Error."""
    document = openapi.document()
    owner = django_user_model.objects.create_user("pager", password="pw")
    client.force_login(owner)
    for i in range(3):
        api.schedule("demo.noop", {}, delay=600 + i, owner=owner)
        api.recur("demo.noop", {}, key=f"page-{i}", cron="0 9 * * *", owner=owner)
    for path in ("/api/jobs/", "/api/recurrences/"):
        first = client.get(path, {"page_size": 2})
        conforms(document, path, "get", first)
        conforms(document, path, "get", client.get(first.json()["next"]))
        deep = client.get(path, {"page": 1500, "page_size": 200})
        assert deep.status_code == 400
        conforms(document, path, "get", deep)
    listed = document["paths"]["/api/jobs/"]["get"]["parameters"]
    assert {p["name"] for p in listed} == jobs_api.LIST_PARAMETERS
