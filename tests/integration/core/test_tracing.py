"""OpenTelemetry spans of schedule, claim and run, against real PostgreSQL and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import signals
from django.conf import settings
from django.test import override_settings
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scheduling import api, exceptions
from scheduling.core import broker, tracing
from scheduling.due_at import claim, runner
from scheduling.models import JobState, ScheduledJob
from tests import support

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "payload-marker-7f3a9c"


_exporter: InMemorySpanExporter | None = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An in-memory exporter on the process's SDK provider, added once (OpenTelemetry allows one provider)."""
    global _exporter
    if _exporter is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    _exporter.clear()
    yield _exporter
    _exporter.clear()


@pytest.fixture
def queue() -> Iterator[None]:
    """The job queue emptied before and after (the claim sends its batch there)."""
    key = f"{settings.CELERY_BROKER_KEYPREFIX}{settings.CELERY_TASK_DEFAULT_QUEUE}"
    client = broker.client()
    client.delete(key)
    yield
    client.delete(key)


def _schedule_claim_run(run_sql) -> int:
    job = api.schedule("demo.record", {"label": MARKER}, delay=60)
    support.make_due(job.id)
    report = claim.claim_and_dispatch()
    assert (report.claimed, report.batches) == (1, 1)
    token = str(ScheduledJob.objects.get(pk=job.id).token)
    assert runner.run_batch([(job.id, token)]).succeeded == 1
    assert ScheduledJob.objects.get(pk=job.id).state == JobState.DONE
    return job.id


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in finished}


@override_settings(SCHEDULING_TRACING=True)
def test_schedule_claim_and_run_are_spans_with_ids_and_kinds(run_sql, spans, queue):
    """Scheduling, claiming, the batch and the job each record a span naming the job id and kind."""
    job_id = _schedule_claim_run(run_sql)
    named = _by_name(spans.get_finished_spans())
    assert {"timekeeper.schedule", "timekeeper.claim", "timekeeper.run_batch", "timekeeper.run_job"} <= set(named)
    scheduled = named["timekeeper.schedule"].attributes
    assert (scheduled["timekeeper.job_id"], scheduled["timekeeper.kind"]) == (job_id, "demo.record")
    assert scheduled["timekeeper.outcome"] == "created"
    claimed = named["timekeeper.claim"].attributes
    assert tuple(claimed["timekeeper.job_ids"]) == (job_id,)
    assert tuple(claimed["timekeeper.kinds"]) == ("demo.record",)
    assert claimed["timekeeper.batches"] == 1
    batch = named["timekeeper.run_batch"].attributes
    assert tuple(batch["timekeeper.job_ids"]) == (job_id,)
    assert tuple(batch["timekeeper.kinds"]) == ("demo.record",)
    assert (batch["timekeeper.started"], batch["timekeeper.succeeded"]) == (1, 1)
    ran = named["timekeeper.run_job"]
    assert ran.attributes["timekeeper.job_id"] == job_id
    assert ran.attributes["timekeeper.kind"] == "demo.record"
    assert ran.attributes["timekeeper.attempt"] == 1
    assert ran.attributes["timekeeper.mechanism"] == "due_at"
    assert ran.attributes["timekeeper.outcome"] == "succeeded"
    assert ran.parent is not None
    assert ran.parent.span_id == named["timekeeper.run_batch"].context.span_id


@override_settings(SCHEDULING_TRACING=True)
def test_no_span_holds_the_payload(run_sql, spans, queue):
    """A marker in the payload appears in no attribute of any span, even of a refused schedule."""
    _schedule_claim_run(run_sql)
    with pytest.raises(exceptions.InvalidPayload):
        api.schedule("demo.record", {"label": MARKER * 20}, delay=60)  # too long: the error quotes it
    api.schedule_many("demo.record", [{"label": MARKER}], delay=60)
    deferral = api.defer("demo.record", {"label": MARKER}, delay=300)  # a Celery message carrying the payload
    assert deferral.mechanism == "deferrals"
    finished = spans.get_finished_spans()
    assert {"timekeeper.schedule_many", "apply_async/scheduling.run_deferred"} <= {s.name for s in finished}
    for recorded in finished:
        text = repr(dict(recorded.attributes or {})) + repr([e.attributes for e in recorded.events])
        text += repr(recorded.status.description)
        assert MARKER not in text, recorded.name


@pytest.fixture
def celery_not_instrumented() -> Iterator[None]:
    """A process that never turned tracing on has no Celery hooks; an earlier test here may have set them."""
    instrumentor = CeleryInstrumentor()
    was = instrumentor.is_instrumented_by_opentelemetry
    if was:
        instrumentor.uninstrument()
    yield
    if was:
        instrumentor.instrument(tracer_provider=trace.get_tracer_provider())
        signals.task_failure.disconnect(instrumentor._trace_failure)


@override_settings(SCHEDULING_TRACING=False)
def test_tracing_off_records_nothing(run_sql, spans, queue, celery_not_instrumented):
    """With tracing off (the default) no span is recorded and span() is the shared no-op."""
    _schedule_claim_run(run_sql)
    assert spans.get_finished_spans() == ()
    assert tracing.span("timekeeper.schedule", kind="demo.record") is tracing.OFF
