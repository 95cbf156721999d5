"""A handler module for bench/hooks_cost.py: the OpenTelemetry SDK set up as an application
would (a batch span processor), exporting to nowhere, so a drain measures what a consumer
span per job costs a worker."""

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class Nowhere(SpanExporter):
    """Takes the spans and drops them: the cost measured is pgpool's and the SDK's, not a
    collector's."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(Nowhere()))
trace.set_tracer_provider(provider)
