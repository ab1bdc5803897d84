"""Kubernetes-style probes for the web process: ``/livez`` and ``/readyz`` (``/healthz`` is ``health``).

- ``/livez``: the process answers HTTP. Nothing else is read: no database, no broker, no session.
  A liveness probe that looked at dependencies would restart healthy pods during an outage of
  PostgreSQL or Redis (a restart cannot fix either) or while the backlog is large, exactly when
  the system is busiest.
- ``/readyz``: this pod can serve requests: PostgreSQL answers a round trip and the broker a
  ``PING`` (the same bounded checks as ``/healthz``). 503 takes the pod out of the Service's
  endpoints until they answer again; it is never restarted for it.
- ``/healthz`` (``scheduling.web.health``) stays what it was: the deployment's work as a whole
  (beat's heartbeat, the backlog); for dashboards and external monitors, not for pod probes.

The bodies have the shape of ``/healthz``'s (``status``, ``failing``, ``checks``); the details
(errors, latencies) need the metrics token or a user allowed to view jobs, like there.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from scheduling.web import health


@never_cache
@require_safe
def livez(request: HttpRequest) -> HttpResponse:
    """200 ``{"status": "ok"}`` whenever the process can answer at all."""
    return JsonResponse({"status": health.OK})


def readiness() -> tuple[bool, dict[str, Any]]:
    """(ready, JSON body): the database and the broker, each with its bounded wait."""
    parts = {"database": health.check_database(), "broker": health.check_broker()}
    failing = [name for name, part in parts.items() if part.status != health.OK]
    body = {
        "status": health.FAILING if failing else health.OK,
        "failing": failing,
        "checks": {name: part.as_json() for name, part in parts.items()},
    }
    return not failing, body


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when PostgreSQL and the broker answer; 503 naming the one(s) that did not."""
    ready, body = readiness()
    if not health.may_see_details(request):
        body = {**body, "checks": {name: {"status": part["status"]} for name, part in body["checks"].items()}}
    return JsonResponse(body, status=200 if ready else 503)
