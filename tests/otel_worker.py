"""OpenTelemetry's SDK in a worker process a test starts (DURQ_TEST_OTEL_SPANS): spans kept in memory by the
SDK's InMemorySpanExporter and written, as JSON, to that file when the process exits."""

import atexit
import json
import os
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


@atexit.register
def _write() -> None:
    spans = [json.loads(span.to_json()) for span in exporter.get_finished_spans()]
    Path(os.environ["DURQ_TEST_OTEL_SPANS"]).write_text(json.dumps(spans))
