"""OpenTelemetry setup: OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, off otherwise."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer
from opentelemetry.trace import TracerProvider as ApiTracerProvider

_NOOP = trace.NoOpTracerProvider()


def build_tracer_provider(service_name: str, otlp_endpoint: str) -> TracerProvider | None:
    if not otlp_endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    return provider


def tracer_for(name: str, provider: ApiTracerProvider | None) -> Tracer:
    """A tracer from the worker's provider; a no-op tracer when tracing is off."""
    return (provider or _NOOP).get_tracer(name)
