"""OpenTelemetry traces for every role: off unless an OTLP endpoint is configured.

``setup(settings, service)`` returns a ``Tracing`` (a tracer and its shutdown) when ``KE_TRACING_ENDPOINT`` or
one of the standard ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` variables is set, else None. The roles choose their
traced parts once, when they are built (``receiver.tracing``, ``dispatcher.tracing``): with tracing off the hot
paths are the untraced code itself, with no per-request check and no allocation (bench/tracing.py measures it).

Spans are exported over OTLP/HTTP (protobuf) in batches from a background thread. The trace context crosses
Kafka as the W3C ``traceparent``/``tracestate`` record headers (the CloudEvents Distributed Tracing extension
names), so one trace shows the sender's request, the ingress, the produce, and each subscription's delivery.

Attribute names follow OpenTelemetry's messaging and CloudEvents semantic conventions; the ones this project adds
(channel, subscription, attempt, outcome) live under ``kafka_eventing.``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka_eventing.core.binding import TRACE_HEADERS

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from kafka_eventing.core.settings import Settings

# -- attribute names (semantic conventions) -----------------------------------------------------------------
CE_ID = "cloudevents.event_id"
CE_TYPE = "cloudevents.event_type"
CE_SOURCE = "cloudevents.event_source"
CE_SPECVERSION = "cloudevents.event_spec_version"
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION = "messaging.operation.type"
MESSAGING_DESTINATION = "messaging.destination.name"
MESSAGING_PARTITION = "messaging.destination.partition.id"
MESSAGING_OFFSET = "messaging.kafka.offset"
MESSAGING_GROUP = "messaging.consumer.group.name"
MESSAGING_BATCH = "messaging.batch.message_count"
HTTP_METHOD = "http.request.method"
HTTP_STATUS = "http.response.status_code"
URL_FULL = "url.full"
URL_PATH = "url.path"
ERROR_TYPE = "error.type"
CHANNEL = "kafka_eventing.channel"
SUBSCRIPTION = "kafka_eventing.subscription"
#: A Broker's events carry these instead of CHANNEL and SUBSCRIPTION ("<namespace>/<name>" each).
BROKER = "kafka_eventing.broker"
TRIGGER = "kafka_eventing.trigger"
ATTEMPT = "kafka_eventing.attempt"
OUTCOME = "kafka_eventing.outcome"

#: The CloudEvents attributes a span carries, by their Kafka binary-mode header and HTTP header names.
EVENT_ATTRIBUTES = {"ce_id": CE_ID, "ce_type": CE_TYPE, "ce_source": CE_SOURCE, "ce_specversion": CE_SPECVERSION}
HTTP_EVENT_ATTRIBUTES = {"ce-id": CE_ID, "ce-type": CE_TYPE, "ce-source": CE_SOURCE,
                         "ce-specversion": CE_SPECVERSION}

OTLP_TRACES_PATH = "/v1/traces"


def traces_url(settings: Settings) -> str:
    """Where spans go, or "" (tracing off). A base endpoint gets the OTLP/HTTP traces path appended."""
    if settings.tracing_traces_endpoint:
        return settings.tracing_traces_endpoint  # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: used as given (the spec)
    base = settings.tracing_base_endpoint
    if not base:
        return ""
    return base if base.rstrip("/").endswith(OTLP_TRACES_PATH) else base.rstrip("/") + OTLP_TRACES_PATH


@dataclass
class Tracing:
    """The tracer a role's traced parts use, and the provider that exports for it."""

    tracer: Tracer
    provider: TracerProvider

    def shutdown(self) -> None:
        """Export what is buffered (bounded by the exporter's timeout), then stop the export thread."""
        self.provider.shutdown()


def setup(settings: Settings, service: str, *, exporter: Any = None) -> Tracing | None:
    """A tracer for ``service`` exporting to the configured endpoint; None when no endpoint is configured.

    Sampling: parent-based on ``KE_TRACING_SAMPLE_RATIO`` (an incoming sampled ``traceparent`` is followed, new
    traces are sampled at the ratio), unless ``OTEL_TRACES_SAMPLER`` is set, which the SDK then reads itself.
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` are honoured too (the SDK's resource detection).
    """
    url = traces_url(settings)
    if not url and exporter is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    sampler = None if settings.tracing_sampler_from_env else ParentBased(TraceIdRatioBased(
        settings.tracing_sample_ratio))
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME over these defaults.
    resource = Resource.create({SERVICE_NAME: service}) if not settings.tracing_service_name_from_env \
        else Resource.create()
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=url)))
    return Tracing(provider.get_tracer("kafka_eventing", _version()), provider)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kafka-eventing")
    except PackageNotFoundError:
        return "dev"


# -- context across HTTP and Kafka (W3C Trace Context) ------------------------------------------------------
@functools.cache
def _propagator() -> TraceContextTextMapPropagator:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def extract(carrier: Mapping[str, str]) -> Context:
    """The context a ``traceparent`` (and ``tracestate``) in ``carrier`` names; empty if none or invalid."""
    return _propagator().extract(carrier)


def inject(span: Span) -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) naming ``span``: what a child in another process continues."""
    from opentelemetry.trace import set_span_in_context

    out: dict[str, str] = {}
    _propagator().inject(out, set_span_in_context(span))
    return out


def kafka_trace(headers: Iterable[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    """The trace headers of a Kafka record as text."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        if name in TRACE_HEADERS and value is not None:
            out[name] = value.decode(errors="replace") if isinstance(value, bytes) else value
    return out


def replace_trace(headers: list[tuple[str, bytes]], trace: Mapping[str, str]) -> None:
    """Make a record's trace headers ``trace`` (in place): the record continues the span that produced it."""
    headers[:] = [(k, v) for k, v in headers if k not in TRACE_HEADERS]
    headers.extend((k, v.encode()) for k, v in trace.items())


def event_attributes(headers: Iterable[tuple[str, bytes | str | None]] | None,
                     names: Mapping[str, str] = EVENT_ATTRIBUTES) -> dict[str, str]:
    """The CloudEvents span attributes found in binary-mode headers (Kafka ``ce_*`` or HTTP ``ce-*``)."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        key = names.get(name.lower() if isinstance(name, str) else name.decode("latin-1").lower())
        if key is not None and value is not None:
            out[key] = value.decode(errors="replace") if isinstance(value, bytes) else value
    return out
