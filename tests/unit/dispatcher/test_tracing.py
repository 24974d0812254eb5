"""dispatcher.tracing.TracedDeliverer with a fake sender: one CONSUMER span per event, a CLIENT span per attempt
named by where it went, numbered, and its context sent along."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from kafka_eventing.core import tracing
from kafka_eventing.core.binding import CloudEvent, event_to_kafka
from kafka_eventing.core.channels import Subscriber
from kafka_eventing.core.http_delivery import Attempt
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher.delivery import Outcome
from kafka_eventing.dispatcher.metrics import Labels, Metrics
from kafka_eventing.dispatcher.tracing import TracedDeliverer

from .conftest import LABELS, spec
from .fakes import FakeSender

SENDER_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{SENDER_TRACE}-b7ad6b7169203331-01"




def test_retries_then_dead_letter_give_one_process_span_and_numbered_attempts() -> None:
    keep = InMemorySpanExporter()
    traces = tracing.setup(Settings(), "dispatcher", exporter=keep)
    assert traces is not None
    sender = FakeSender({"http://s": [Attempt(503), Attempt(500), Attempt(500)], "http://dls": [Attempt(202)]})

    async def sleep(_seconds: float) -> None:
        pass

    deliverer = TracedDeliverer(sender, Metrics(CollectorRegistry()), 600, tracer=traces.tracer,  # type: ignore[arg-type]
                                sleep=sleep)
    record = event_to_kafka(CloudEvent({"id": "e1", "source": "/s", "type": "t", "specversion": "1.0"}, b"x"),
                            trace={"traceparent": PARENT})
    sub = Subscriber("uid", "http://s", delivery=spec(retry=2, sink="http://dls"))
    outcome = asyncio.run(deliverer.handle(record.headers, record.value, sub, LABELS))
    traces.shutdown()

    assert outcome is Outcome.DEAD_LETTERED
    (process,) = [s for s in keep.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    clients = [s for s in keep.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert format(process.parent.span_id, "016x") == "b7ad6b7169203331"
    assert process.attributes["kafka_eventing.outcome"] == "dead_lettered"
    assert process.attributes["cloudevents.event_id"] == "e1"
    assert process.attributes["kafka_eventing.subscription"] == "uid"
    assert "kafka_eventing.broker" not in process.attributes
    assert [(s.name, s.attributes["kafka_eventing.attempt"]) for s in clients] == [
        ("deliver POST", 1), ("deliver POST", 2), ("deliver POST", 3), ("dead-letter POST", 1)]
    assert all(s.parent.span_id == process.context.span_id for s in clients)
    assert all(format(s.context.trace_id, "032x") == SENDER_TRACE for s in keep.get_finished_spans())
    # Each request carried its own attempt's context.
    sent = [headers["traceparent"].split("-")[2] for _url, headers, _body in sender.calls]
    assert sent == [format(s.context.span_id, "016x") for s in clients]
    assert [s.attributes.get("http.response.status_code") for s in clients] == [503, 500, 500, 202]


def test_a_trigger_delivery_names_its_broker_and_trigger() -> None:
    keep = InMemorySpanExporter()
    traces = tracing.setup(Settings(), "dispatcher", exporter=keep)
    assert traces is not None
    sender = FakeSender({"http://s": [Attempt(200)]})
    # A Broker's dispatcher: the "channel" label is the Broker, the subscriber uid the Trigger's name.
    deliverer = TracedDeliverer(sender, Metrics(CollectorRegistry()), 600, tracer=traces.tracer,  # type: ignore[arg-type]
                                broker=True)
    record = event_to_kafka(CloudEvent({"id": "e2", "source": "/s", "type": "t", "specversion": "1.0"}, b"x"))
    outcome = asyncio.run(deliverer.handle(record.headers, record.value, Subscriber("orders", "http://s"),
                                           Labels("ns", "default", "orders")))
    traces.shutdown()

    assert outcome is Outcome.DELIVERED
    (process,) = [s for s in keep.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    (client,) = [s for s in keep.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert process.attributes["kafka_eventing.broker"] == "ns/default"
    assert process.attributes["kafka_eventing.trigger"] == "ns/orders"
    assert "kafka_eventing.channel" not in process.attributes
    assert "kafka_eventing.subscription" not in process.attributes
    assert process.attributes["kafka_eventing.outcome"] == "delivered"
    assert (client.name, client.parent.span_id) == ("deliver POST", process.context.span_id)
