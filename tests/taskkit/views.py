"""Two views of a product that uses Django's Tasks API: enqueue a task, read its result (tests only)."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from tests.taskkit import tasks

NAMED = {"add": tasks.add, "async_double": tasks.async_double, "record": tasks.record}


@csrf_exempt
@require_POST
def enqueue(request: HttpRequest, name: str) -> JsonResponse:
    """Enqueue the named task with the JSON body's args, in the request's transaction; 202 with its result id."""
    body = json.loads(request.body or b"{}")
    with transaction.atomic():
        result = NAMED[name].enqueue(*body.get("args", []))
    return JsonResponse({"id": result.id, "status": str(result.status)}, status=202)


@require_GET
def result(request: HttpRequest, name: str, result_id: str) -> JsonResponse:
    """The task's result as Django's TaskResult gives it."""
    found = NAMED[name].get_result(result_id)
    return JsonResponse(
        {
            "status": str(found.status),
            "return_value": found.return_value if found.is_finished and not found.errors else None,
            "worker_ids": found.worker_ids,
            "attempts": found.attempts,
            "finished": found.finished_at is not None,
        }
    )
