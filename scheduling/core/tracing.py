"""OpenTelemetry spans for scheduling, claiming and running jobs; off unless ``SCHEDULING_TRACING``.

``span(name, **attributes)`` is the one helper: ``with tracing.span("timekeeper.claim") as s:``
then ``s.set("job_ids", ids)``. Attribute names get the ``timekeeper.`` prefix. Only ids, kinds,
attempts, mechanisms, counts and outcomes go on a span, never a payload or an error message (either
may hold personal data): a failure is recorded by its exception type alone.

Off (the default), ``span()`` returns one shared no-op object after a boolean check: no tracer,
no SDK import, no allocation. On, the tracer provider is configured on first use: the global one
if the process already has an SDK provider (set by ``opentelemetry-instrument`` or a test),
otherwise a new one that exports with OTLP over HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and to the console otherwise. The exporter reads
the rest of the standard ``OTEL_*`` environment (service name, headers, sampler) itself.

Spans: ``timekeeper.schedule`` and ``timekeeper.schedule_many`` (``due_at/api.py``),
``timekeeper.claim`` (``due_at/claim.py``), ``timekeeper.run_batch`` (``due_at/runner.py``) and
``timekeeper.run_job`` (``core/executor.py``: every handler call, whatever the mechanism).
The Celery hop is instrumented by opentelemetry-instrumentation-celery, switched on with the
provider: a message carries its trace context in its headers, so a claim, the ``run_batch`` it
sends and the handlers that batch runs are one trace (``apply_async/...`` and ``run/...`` spans
between them). Its failure handler is left unconnected: it would put the exception's message and
traceback on the span, and either may quote a payload.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from scheduling.core import conf

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

logger = logging.getLogger(__name__)

PREFIX = "timekeeper."
TRACER_NAME = "timekeeper"

_tracer: Tracer | None = None
_setup_lock = threading.Lock()

Value = str | bool | int | float | Sequence[str] | Sequence[int]


class _Off:
    """What ``span()`` returns when tracing is off: a context manager whose ``set`` does nothing."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, name: str, value: Value | None) -> None:
        return None


class _On:
    """A live span's handle: ``set`` adds an attribute (prefixed; None is left out)."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def set(self, name: str, value: Value | None) -> None:
        if value is not None:
            self.span.set_attribute(PREFIX + name, value)


OFF = _Off()
Handle = _On | _Off  # what ``with span(...) as s`` gives: ``s.set(name, value)``


def enabled() -> bool:
    """Whether spans are recorded (``SCHEDULING_TRACING``)."""
    return conf.get().tracing


def span(name: str, **attributes: Value | None) -> contextlib.AbstractContextManager[_On | _Off]:
    """A span named ``name`` with ``attributes`` (prefixed ``timekeeper.``); a shared no-op when off."""
    if not conf.get().tracing:
        return OFF
    return _recording(name, attributes)


@contextlib.contextmanager
def _recording(name: str, attributes: dict[str, Value | None]) -> Iterator[_On]:
    from opentelemetry.trace import Status, StatusCode

    # No exception event and no status description: an error message may quote a payload.
    with tracer().start_as_current_span(name, record_exception=False, set_status_on_exception=False) as live:
        handle = _On(live)
        for key, value in attributes.items():
            handle.set(key, value)
        try:
            yield handle
        except BaseException as exc:
            live.set_status(Status(StatusCode.ERROR))
            live.set_attribute(PREFIX + "error_type", type(exc).__name__)
            raise


def tracer() -> Tracer:
    """The tracer, configuring the provider on first use."""
    global _tracer
    if _tracer is None:
        with _setup_lock:
            if _tracer is None:
                _tracer = _configure()
    return _tracer


def _configure() -> Tracer:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()  # service name and resource from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
        exporter: SpanExporter
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        logger.info("tracing on", extra={"action": "tracing_on", "exporter": type(exporter).__name__})
    _instrument_celery(provider)
    return provider.get_tracer(TRACER_NAME)


def _instrument_celery(provider: TracerProvider) -> None:
    """Spans for publishing and running Celery tasks, the trace context carried in the message headers."""
    from celery import signals
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentor = CeleryInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:  # opentelemetry-instrument, or an earlier call
        return
    instrumentor.instrument(tracer_provider=provider)
    # A failure's span would hold the exception's message and traceback: they may quote a payload.
    signals.task_failure.disconnect(instrumentor._trace_failure)


def start_in_worker_process() -> None:
    """In a pool process, before its first task: the provider and the Celery hooks, so every task is traced."""
    if enabled():
        tracer()
