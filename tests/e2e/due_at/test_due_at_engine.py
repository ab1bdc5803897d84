"""The due_at engine end to end: a real worker and a real beat."""

from __future__ import annotations

import datetime as dt
import gzip
import http.server
import threading
from typing import ClassVar

import pytest
from django.db.models import Max
from django.db.models.functions import Now
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from scheduling import api
from scheduling.models import CLAIM_STATES, JobAttempt, JobState, ScheduledJob
from tasks.models import Execution
from tests.e2e.harness import wait_for, wait_ready

pytestmark = [pytest.mark.e2e]


def test_due_job_runs_once_cancelled_never_failing_retries_to_dead(cluster):
    """A job due in 2 s runs once, a cancelled one never runs, a failing one retries to dead."""
    worker = cluster.worker()
    cluster.beat()
    wait_ready(worker)
    runs = api.schedule("demo.record", {"label": "due-in-2s"}, delay=2)
    cancelled = api.schedule("demo.record", {"label": "cancelled"}, delay=2)
    failing = api.schedule("demo.fail", {}, delay=1)
    api.cancel(cancelled.id)

    wait_for(lambda: ScheduledJob.objects.get(pk=runs.id).state == JobState.DONE, 30, message="the due job to run")
    wait_for(
        lambda: ScheduledJob.objects.get(pk=failing.id).state == JobState.DEAD, 60, message="the failing job to die"
    )

    assert Execution.objects.filter(idempotency_key=f"job:{runs.id}").count() == 1
    assert not Execution.objects.filter(idempotency_key=f"job:{cancelled.id}").exists()
    assert ScheduledJob.objects.get(pk=cancelled.id).state == JobState.CANCELLED
    dead = ScheduledJob.objects.get(pk=failing.id)
    assert dead.attempts == dead.max_attempts == 3
    assert Execution.objects.filter(idempotency_key=f"job:{failing.id}").count() == 3
    outcomes = list(JobAttempt.objects.filter(job_id=failing.id).order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["failed", "failed", "failed"]
    attempt = JobAttempt.objects.get(job_id=runs.id)
    assert attempt.outcome == "succeeded"
    assert attempt.started_at >= runs.due_at, "nothing runs before its due time"
    assert JobAttempt.objects.aggregate(m=Max("number"))["m"] == 3


def test_timeout_stops_a_handler(cluster):
    """A handler running past its kind's timeout is stopped and recorded as timed_out."""
    worker = cluster.worker()
    cluster.beat()
    wait_ready(worker)
    job = api.schedule("demo.sleep", {"seconds": 30}, delay=0)
    wait_for(lambda: ScheduledJob.objects.get(pk=job.id).state == JobState.DEAD, 60, message="the sleeper to die")
    outcomes = list(JobAttempt.objects.filter(job_id=job.id).values_list("outcome", flat=True))
    assert outcomes == ["timed_out", "timed_out"]
    for attempt in JobAttempt.objects.filter(job_id=job.id):
        assert (attempt.finished_at - attempt.started_at).total_seconds() < 30, "stopped, not slept out"


def test_one_worker_and_no_beat_claim_run_and_sweep_with_every_process_running_handlers(cluster):
    """One `celery worker -c 2`, no beat: two jobs run at once (control takes no seat) and a dead claim is swept."""
    worker = cluster.worker(concurrency=2)
    wait_ready(worker)
    wait_for(lambda: "control loop leads here" in worker.log(), 30, message="the worker's control loop to lead")
    # A claim whose worker vanished (started, no heartbeat for longer than its lease): the sweeper takes it back.
    stranded = api.schedule("demo.record", {"label": "stranded"}, delay=3600)
    ScheduledJob.objects.filter(pk=stranded.id).update(
        state=JobState.RUNNING,
        token="00000000-0000-0000-0000-000000000001",
        claimed_by="gone:1",
        attempts=1,
        claimed_at=Now() - dt.timedelta(minutes=10),
        heartbeat_at=Now() - dt.timedelta(minutes=10),
        due_at=Now(),
    )
    sleepers = [api.schedule("demo.sleep", {"seconds": 1.5}, delay=0) for _ in range(2)]

    def both_running() -> set[int]:
        started = Execution.objects.filter(idempotency_key__in=[f"job:{j.id}" for j in sleepers])
        still_claimed = ScheduledJob.objects.filter(pk__in=[j.id for j in sleepers], state__in=CLAIM_STATES).count()
        return {e.pid for e in started} if still_claimed == 2 else set()

    pids = wait_for(lambda: len(both_running()) == 2 and both_running(), 30, message="both sleepers running at once")
    assert pids <= set(worker.children()), "two pool processes ran handlers at the same time"
    wait_for(
        lambda: ScheduledJob.objects.get(pk=stranded.id).state == JobState.DONE, 60, message="the swept job to run"
    )
    outcomes = list(JobAttempt.objects.filter(job_id=stranded.id).order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["reclaimed", "succeeded"]


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: keeps (name, trace id, span id, parent span id) of every span posted."""

    spans: ClassVar[list[tuple[str, str, str, str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for s in scope.spans:
                    self.spans.append((s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex()))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        return None


def test_a_claim_its_batch_and_the_handler_are_one_trace_across_celery(cluster):
    """With tracing on, the trace context crosses the broker: claim → publish → run → run_batch → run_job."""
    _Collector.spans = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        worker = cluster.worker(env={
            "SCHEDULING_TRACING": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # export every 0.2 s
        })  # fmt: skip
        wait_ready(worker)
        job = api.schedule("demo.record", {}, delay=0)

        def chain() -> list[tuple[str, str, str, str]] | None:
            by_id = {span_id: (name, trace, span_id, parent) for name, trace, span_id, parent in list(_Collector.spans)}
            for name, trace, span_id, parent in list(_Collector.spans):
                if name == "timekeeper.run_job":
                    path = [(name, trace, span_id, parent)]
                    while path[-1][3] in by_id:
                        path.append(by_id[path[-1][3]])
                    if path[-1][0] == "timekeeper.claim":
                        return path
            return None

        path = wait_for(chain, 30, message="the handler's span to reach the claim's through Celery")
    finally:
        server.shutdown()
        server.server_close()
    assert [name for name, *_ in path] == [
        "timekeeper.run_job",
        "timekeeper.run_batch",
        "run/scheduling.run_batch",
        "apply_async/scheduling.run_batch",
        "timekeeper.claim",
    ]
    assert len({trace for _, trace, _, _ in path}) == 1, "one trace"
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DONE
