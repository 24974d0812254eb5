"""Tracing setup from settings: off unless an endpoint is configured, the OTLP URL, sampling, and the W3C helpers."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kafka_eventing.core import tracing
from kafka_eventing.core.settings import Settings, SettingsError


def test_off_without_an_endpoint() -> None:
    assert tracing.setup(Settings.from_env({}), "svc") is None


@pytest.mark.parametrize(("env", "url"), [
    ({"KE_TRACING_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces"),
    ({"KE_TRACING_ENDPOINT": "http://c:4318/v1/traces"}, "http://c:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://o:4318/"}, "http://o:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x", "KE_TRACING_ENDPOINT": "http://c:4318"}, "http://t:9/x"),
])
def test_endpoint_from_ke_or_standard_otel_variables(env: dict[str, str], url: str) -> None:
    assert tracing.traces_url(Settings.from_env(env)) == url


def test_sample_ratio_is_checked() -> None:
    with pytest.raises(SettingsError, match="KE_TRACING_SAMPLE_RATIO"):
        Settings.from_env({"KE_TRACING_SAMPLE_RATIO": "1.5"})


def test_ratio_zero_follows_a_sampled_parent_and_samples_nothing_new() -> None:
    keep = InMemorySpanExporter()
    traces = tracing.setup(Settings(tracing_sample_ratio=0.0), "svc", exporter=keep)
    assert traces is not None
    parent = tracing.extract({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    traces.tracer.start_span("followed", context=parent, kind=SpanKind.SERVER).end()
    traces.tracer.start_span("new").end()
    traces.shutdown()
    assert [s.name for s in keep.get_finished_spans()] == ["followed"]
    assert keep.get_finished_spans()[0].resource.attributes["service.name"] == "svc"
    assert format(keep.get_finished_spans()[0].context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"


def test_record_headers_carry_the_span_that_produced_them() -> None:
    traces = tracing.setup(Settings(), "svc", exporter=InMemorySpanExporter())
    assert traces is not None
    span = traces.tracer.start_span("send")
    headers = [("ce_id", b"1"), ("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
    tracing.replace_trace(headers, tracing.inject(span))
    carried = tracing.kafka_trace(headers)
    assert carried["traceparent"].split("-")[2] == format(span.get_span_context().span_id, "016x")
    assert [k for k, _ in headers] == ["ce_id", "traceparent"]
    assert tracing.event_attributes(headers) == {tracing.CE_ID: "1"}
    span.end()
    traces.shutdown()
