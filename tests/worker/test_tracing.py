"""One trace from a Django request through ``enqueue()`` into the handler, run by a real worker (OpenTelemetry)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from django_durq.models import Job
from tests.conftest import wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect


def enqueue_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(jobs.traced.enqueue().pk))


urlpatterns = [path("orders/", enqueue_view)]


def server_spans(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """What the Django instrumentation does for each request: continue the caller's trace in a server span."""

    def middleware(request: HttpRequest) -> HttpResponse:
        parent = propagate.extract(request.headers)
        tracer = trace.get_tracer("tests.server")
        with tracer.start_as_current_span(f"{request.method} {request.path}", context=parent, kind=trace.SpanKind.SERVER):
            return get_response(request)

    return middleware


def _reset_tracer_provider() -> None:
    # The API lets a process set its provider once; the tests set one each (as OpenTelemetry's own tests do).
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    _reset_tracer_provider()
    trace.set_tracer_provider(provider)
    yield spans
    _reset_tracer_provider()


@pytest.mark.processes
@pytest.mark.urls("tests.worker.test_tracing")
def test_one_trace_from_the_request_through_enqueue_into_the_handler(exporter, spawn_worker, settings, tmp_path: Path):
    settings.MIDDLEWARE = ["tests.worker.test_tracing.server_spans", *settings.MIDDLEWARE]
    with trace.get_tracer("tests.client").start_as_current_span("client", kind=trace.SpanKind.CLIENT) as client:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        job_id = int(Client(headers=headers).get("/orders/").content)
    stored = Job.objects.get(pk=job_id).trace_context
    assert stored and "traceparent" in json.loads(stored)

    written = tmp_path / "worker-spans.json"
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_OTEL_SPANS": str(written)})
    wait_until(lambda: Effect.objects.filter(job_id=job_id).exists(), 60, "the job to run")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()

    here = {span.name: span for span in exporter.get_finished_spans()}
    server, enqueue = here["GET /orders/"], here["durq enqueue tests.traced"]
    runs = [span for span in json.loads(written.read_text()) if span["name"] == "durq run tests.traced"]
    assert len(runs) == 1, runs
    run = runs[0]
    trace_id = f"0x{client.get_span_context().trace_id:032x}"
    # One trace: the client's request, the server's span, the enqueue, the run, and the handler inside the run.
    assert f"0x{server.context.trace_id:032x}" == f"0x{enqueue.context.trace_id:032x}" == run["context"]["trace_id"] == trace_id
    assert server.parent.span_id == client.get_span_context().span_id
    assert enqueue.parent.span_id == server.context.span_id
    assert run["parent_id"] == f"0x{enqueue.context.span_id:016x}"
    handler_trace, handler_span = Effect.objects.get(job_id=job_id).tag.split(":")
    assert (f"0x{handler_trace}", f"0x{handler_span}") == (trace_id, run["context"]["span_id"])

    assert enqueue.kind == trace.SpanKind.PRODUCER and run["kind"] == "SpanKind.CONSUMER"
    named = {"durq.job.id": job_id, "durq.job.name": "tests.traced", "durq.queue": "default"}
    assert named.items() <= dict(enqueue.attributes).items() and named.items() <= run["attributes"].items()
    assert run["attributes"]["durq.job.attempt"] == 1


def test_a_failed_run_records_its_exception_on_its_span(exporter, transactional_db):
    from django_durq.testing import drain

    jobs.fail.using(max_attempts=1).enqueue(message="card declined")
    drain()
    (run,) = [span for span in exporter.get_finished_spans() if span.name == "durq run tests.fail"]
    assert run.status.status_code == trace.StatusCode.ERROR
    assert [event.attributes["exception.message"] for event in run.events] == ["card declined"]


def test_without_a_tracer_provider_nothing_is_stored(transactional_db):
    _reset_tracer_provider()
    job = jobs.noop.enqueue()
    assert Job.objects.get(pk=job.pk).trace_context is None


def test_a_workflows_jobs_carry_the_context_of_its_one_enqueue_span(exporter, transactional_db):
    from django_durq import Workflow

    flow = Workflow("traced")
    first = flow.add(jobs.noop)
    flow.add(jobs.noop, after=[first])
    with trace.get_tracer("tests.client").start_as_current_span("request"):
        flow.enqueue()
    # traceparent: version-trace id-parent span id-flags
    stored = {
        tuple(json.loads(text)["traceparent"].split("-")[1:3]) for text in Job.objects.values_list("trace_context", flat=True)
    }
    (enqueue,) = [span for span in exporter.get_finished_spans() if span.name.startswith("durq enqueue")]
    assert stored == {(f"{enqueue.context.trace_id:032x}", f"{enqueue.context.span_id:016x}")}
    assert enqueue.attributes["messaging.batch.message_count"] == 2


def test_without_a_tracer_provider_a_run_sends_no_signal_nobody_listens_to(transactional_db):
    """Tracing is not a receiver of the application's signals: with OpenTelemetry installed and no
    provider set, a run whose application connected no receiver sends neither signal."""
    from django_durq.signals import job_postrun, job_prerun
    from django_durq.testing import drain

    _reset_tracer_provider()
    sent: list[str] = []
    send_robust = job_prerun.send_robust.__func__  # type: ignore[attr-defined]

    def counting(signal, sender, **kwargs):  # type: ignore[no-untyped-def]
        if signal is job_prerun or signal is job_postrun:
            sent.append(kwargs.get("name", "?"))
        return send_robust(signal, sender, **kwargs)

    jobs.noop.enqueue()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(job_prerun), "send_robust", counting)
        assert drain()["finished"] == 1
    assert sent == []


def test_the_application_s_signal_receivers_run_inside_the_run_span(exporter, transactional_db):
    from django_durq.signals import job_postrun, job_prerun
    from django_durq.testing import drain

    current: dict[str, str] = {}

    def before(sender, name, **kwargs):  # type: ignore[no-untyped-def]
        current["prerun"] = getattr(trace.get_current_span(), "name", "")

    def after(sender, name, **kwargs):  # type: ignore[no-untyped-def]
        current["postrun"] = getattr(trace.get_current_span(), "name", "")

    job_prerun.connect(before)
    job_postrun.connect(after)
    try:
        jobs.noop.enqueue()
        assert drain()["finished"] == 1
    finally:
        job_prerun.disconnect(before)
        job_postrun.disconnect(after)
    assert current == {"prerun": "durq run tests.noop", "postrun": "durq run tests.noop"}
    (run,) = [span for span in exporter.get_finished_spans() if span.name == "durq run tests.noop"]
    assert run.end_time is not None


def test_a_run_span_that_cannot_be_made_costs_the_trace_not_the_job(exporter, transactional_db, monkeypatch, caplog):
    from django_durq.execution import tracing
    from django_durq.testing import drain

    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise RuntimeError("exporter misconfigured")

    jobs.noop.enqueue()
    monkeypatch.setattr(tracing, "attributes", broken)
    assert drain()["finished"] == 1
    assert not [span for span in exporter.get_finished_spans() if span.name.startswith("durq run")]
    assert "exporter misconfigured" in caplog.text


def test_an_enqueue_span_that_cannot_be_made_costs_the_trace_not_the_enqueue(exporter, transactional_db, monkeypatch, caplog):
    from django_durq.execution import tracing

    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise RuntimeError("exporter misconfigured")

    monkeypatch.setattr(tracing, "attributes", broken)
    job = jobs.noop.enqueue()
    assert Job.objects.get(pk=job.pk).trace_context is None
    assert "exporter misconfigured" in caplog.text


def test_an_enqueue_that_fails_still_ends_its_span_with_the_error(exporter, transactional_db):
    from django_durq.execution import tracing

    with pytest.raises(ValueError, match="the insert failed"), tracing.enqueuing("tests.noop", "default"):
        raise ValueError("the insert failed")
    (span,) = [span for span in exporter.get_finished_spans() if span.name == "durq enqueue tests.noop"]
    assert span.status.status_code == trace.StatusCode.ERROR
