"""A trace from the code that enqueues a job into the handler that runs it, with OpenTelemetry.

With ``opentelemetry-api`` installed (``pip install django-durq[otel]``) and a tracer provider
set (the SDK's, as the application configures it), every enqueue is a span, ``durq enqueue
<job type>``, whose context (W3C ``traceparent``, and ``baggage``) is stored with the job in
``durq_job.trace_context``; the run of each attempt is a span, ``durq run <job type>``, child of
that context, around the handler and the receivers of ``job_prerun`` and ``job_postrun``. A request
traced by the Django instrumentation thus continues into the jobs it queues. Both spans carry
the job's id, type, queue and attempt; a handler's exception is recorded on its run span.

Without OpenTelemetry, or with no tracer provider set, nothing is stored and nothing is read:
an enqueue writes the row it always wrote, and the run side costs one read of the job's
``trace_context`` per attempt only while tracing is on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ..exceptions import Retry

INSTRUMENTATION = "django_durq"
logger = logging.getLogger("django_durq")
_running = threading.local()  # the run span of this handler thread, and the context token to detach


@cache
def _api() -> Any | None:
    """``opentelemetry.trace``, imported once; None when OpenTelemetry is not installed (an enqueue and a run ask)."""
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    from opentelemetry import trace  # optional: the otel extra

    return trace


def _tracing() -> Any | None:
    """``opentelemetry.trace`` when a tracer provider is set; None when tracing is off."""
    trace = _api()
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # not installed, or no provider set: every span would be a no-op
    return trace


def attributes(job_id: int | None, name: str, queue: str, attempt: int) -> dict[str, Any]:
    found: dict[str, Any] = {
        "messaging.system": "durq",
        "messaging.destination.name": queue,
        "durq.job.name": name,
        "durq.queue": queue,
        "durq.job.attempt": attempt,
    }
    if job_id is not None:
        found["durq.job.id"] = job_id
        found["messaging.message.id"] = str(job_id)
    return found


@dataclass
class Enqueue:
    columns: dict[str, str] = field(default_factory=dict)  # to write with each job: its trace context, if any
    ids: list[int] = field(default_factory=list)  # the jobs inserted, told by the caller


@contextmanager
def enqueuing(name: str, queue: str) -> Iterator[Enqueue]:
    """Around the insert of jobs of type ``name``: a span whose context the jobs store (``columns``).

    The caller adds the ids of the jobs it inserted to ``ids``; the span names them. A span that
    cannot be opened or closed (a broken exporter) is logged and the jobs are queued untraced:
    a trace never costs an enqueue, nor makes one that committed look failed.
    """
    enqueue = Enqueue()
    trace = _tracing()
    span = None
    if trace is not None:
        try:
            span = _enqueue_span(trace, name, queue, enqueue)
            span.__enter__()
        except Exception:  # the jobs are queued all the same, without a trace context
            logger.warning("durq: could not open the enqueue span of %r; its jobs are queued untraced", name, exc_info=True)
            span = None
            enqueue.columns.clear()
    try:
        yield enqueue
    except BaseException as error:
        if span is not None:
            _close(span, error)
        raise
    if span is not None:
        _close(span, None)


@contextmanager
def _enqueue_span(trace: Any, name: str, queue: str, enqueue: Enqueue) -> Iterator[None]:
    from opentelemetry import propagate  # optional: the otel extra

    tracer = trace.get_tracer(INSTRUMENTATION)
    with tracer.start_as_current_span(
        f"durq enqueue {name}", kind=trace.SpanKind.PRODUCER, attributes=attributes(None, name, queue, 0)
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier:
            enqueue.columns["trace_context"] = json.dumps(carrier, sort_keys=True)
        yield
        if len(enqueue.ids) == 1:
            span.set_attribute("durq.job.id", enqueue.ids[0])
            span.set_attribute("messaging.message.id", str(enqueue.ids[0]))
        elif enqueue.ids:
            span.set_attribute("messaging.batch.message_count", len(enqueue.ids))


def _close(span: AbstractContextManager[None], error: BaseException | None) -> None:
    """End the enqueue span; what ending it raises is logged, never passed to the caller (``error`` is theirs)."""
    try:
        if error is None:
            span.__exit__(None, None, None)
        else:
            span.__exit__(type(error), error, error.__traceback__)
    except Exception as raised:  # the jobs were queued (or failed) whatever the exporter does
        if raised is not error:
            logger.warning("durq: could not close an enqueue span", exc_info=True)


def run_started(job_id: int, name: str, queue: str, attempt: int) -> bool:
    """Open the run span of this attempt in the handler's thread, when tracing is on; whether one was opened.

    Called by the slot around the handler and its ``job_prerun``/``job_postrun`` receivers, not as
    a receiver itself: with OpenTelemetry installed and no provider set, a run sends no signal
    that nobody else listens to (two sends through Django's dispatcher cost more than the rest
    of a no-op job's run on the slot).
    """
    trace = _tracing()
    if trace is None:
        return False
    try:
        _open_run_span(trace, job_id, name, queue, attempt)
    except Exception:  # a trace that cannot be made must not cost the job its run
        logger.warning("durq: could not open the run span of job %s (%s); it runs untraced", job_id, name, exc_info=True)
        return False
    return True


def _open_run_span(trace: Any, job_id: int, name: str, queue: str, attempt: int) -> None:
    from opentelemetry import context, propagate  # optional: the otel extra

    from ..models import Job  # app loading: called only by a worker, once apps are ready

    stored = Job.objects.filter(pk=job_id).values_list("trace_context", flat=True).first()
    parent = propagate.extract(json.loads(stored)) if stored else None
    span = trace.get_tracer(INSTRUMENTATION).start_span(
        f"durq run {name}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes(job_id, name, queue, attempt)
    )
    _running.span = span
    _running.token = context.attach(trace.set_span_in_context(span))


def run_ended(error: BaseException | None) -> None:
    """Close the run span ``run_started`` opened in this thread; ``error``, what the handler raised, is recorded on it."""
    span = getattr(_running, "span", None)
    if span is None:
        return
    from opentelemetry import context, trace  # optional: the otel extra

    _running.span = None
    try:
        if error is not None and not isinstance(error, Retry):  # a retry the handler asked for is no error
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
    except Exception:  # the outcome is recorded whatever the exporter does
        logger.warning("durq: could not close a run span", exc_info=True)
    finally:
        context.detach(_running.token)
