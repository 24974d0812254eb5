"""A Broker's dispatch parts: Triggers as subscribers, record attributes for filters, the reply hop TTL."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from kafka_eventing.broker.filters import RecordFilter, TriggerFilters, compile_trigger, record_attributes
from kafka_eventing.core import brokers as kb
from kafka_eventing.core.binding import CloudEvent, ContentMode, event_to_kafka
from kafka_eventing.core.channels import Subscriber
from kafka_eventing.core.http_delivery import Attempt
from kafka_eventing.dispatcher.delivery import TTL_EXTENSION, Deliverer, Outcome
from kafka_eventing.dispatcher.metrics import Metrics
from kafka_eventing.dispatcher.triggers import broker_channel

from .conftest import LABELS
from .fakes import FakeSender, broker, trigger

EVENT = CloudEvent({"id": "1", "source": "/orders", "type": "com.example.created", "specversion": "1.0",
                    "region": "eu", "datacontenttype": "application/json"}, b'{"n":1}')


class Record:
    def __init__(self, headers: list[tuple[str, bytes]], value: bytes | None) -> None:
        self._headers, self._value = headers, value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def value(self) -> bytes | None:
        return self._value


def test_record_attributes_in_both_content_modes() -> None:
    for mode in ContentMode:
        record = event_to_kafka(EVENT, mode)
        attrs = record_attributes(record.headers, record.value)
        assert attrs["type"] == "com.example.created" and attrs["region"] == "eu", mode
        assert attrs["datacontenttype"] == "application/json", mode
        assert "data" not in attrs


def test_record_filter_applies_the_compiled_trigger_filter() -> None:
    record = event_to_kafka(EVENT, ContentMode.BINARY)
    message = Record(record.headers, record.value)
    assert RecordFilter(compile_trigger({"filters": [{"prefix": {"type": "com.example."}}]}))(message)
    assert not RecordFilter(compile_trigger({"filter": {"attributes": {"region": "us"}}}))(message)
    # Equal filters are equal matchers: an unchanged Trigger does not restart its consumer.
    spec = {"filters": [{"exact": {"region": "eu"}}]}
    assert RecordFilter(compile_trigger(spec)) == RecordFilter(compile_trigger(spec))






def test_triggers_become_subscribers_of_the_broker_channel() -> None:
    filters = TriggerFilters()
    triggers = [
        trigger("a", filters=[{"exact": {"type": "x"}}]),
        trigger("b", ordered=True, delivery={"retry": 1, "deadLetterSink": {"uri": "http://dls"}}),
        trigger("other-broker", broker_name="c"),
        trigger("unresolved", uri=None),
        trigger("bad-filter", filters=[{"regex": {"type": "x"}}]),
    ]
    channel = broker_channel(broker(), triggers, filters)
    assert channel is not None
    assert channel.topic == "knative-broker-ns-b" and channel.ready
    subs = {s.uid: s for s in channel.subscribers}
    assert set(subs) == {"a", "b", "unresolved", "bad-filter"}  # the other Broker's Trigger is not here
    # Not dispatchable ones are held (reported, never consumed for), with the reason.
    assert subs["unresolved"].held == "SubscriberResolved is False (DestinationNotFound)"
    assert subs["bad-filter"].held.startswith("invalid filter: spec.filters[0]")
    assert not subs["a"].held and not subs["b"].held
    a, b = subs["a"], subs["b"]
    assert not a.ordered and b.ordered  # unordered by default; ordered by annotation
    assert a.delivery.retry == 7 and b.delivery.retry == 1  # the Trigger's delivery, else the Broker's
    assert a.reply_uri == "http://receiver/ns/b" and a.hop_ttl
    assert a.event_filter is not None and b.event_filter is not None
    compiles = filters.compiles
    assert broker_channel(broker(), triggers, filters) == channel  # rebuilt: equal, nothing recompiled
    assert filters.compiles == compiles
    other_class = broker()
    other_class["metadata"]["annotations"][kb.ANNOTATION_BROKER_CLASS] = "MTChannelBasedBroker"
    assert broker_channel(other_class, triggers, filters) is None


def deliver(ttl: str | None, reply: Attempt) -> tuple[Outcome, FakeSender, Metrics]:
    attributes = {"id": "1", "source": "/s", "type": "t", "specversion": "1.0"}
    if ttl is not None:
        attributes[TTL_EXTENSION] = ttl
    record = event_to_kafka(CloudEvent(attributes, b"hi"), ContentMode.BINARY)
    sender = FakeSender({"http://sub": [reply], "http://broker": [Attempt(202)]})
    metrics = Metrics(CollectorRegistry())
    deliverer = Deliverer(sender, metrics, 600)  # type: ignore[arg-type]
    sub = Subscriber("t", "http://sub", reply_uri="http://broker", hop_ttl=True)
    return asyncio.run(deliverer.handle(record.headers, record.value, sub, LABELS)), sender, metrics


REPLY = Attempt(200, b"pong", {"ce-id": "r", "ce-source": "/r", "ce-type": "reply", "ce-specversion": "1.0"})


def test_replies_go_back_to_the_broker_with_one_hop_less() -> None:
    outcome, sender, _ = deliver(None, REPLY)
    assert outcome is Outcome.DELIVERED
    assert sender.to("http://broker")[0][1][f"ce-{TTL_EXTENSION}"] == "254"  # a fresh event counts as 255
    _, sender, _ = deliver("3", REPLY)
    assert sender.to("http://broker")[0][1][f"ce-{TTL_EXTENSION}"] == "2"


def test_an_event_out_of_hops_is_dropped_and_counted() -> None:
    outcome, sender, metrics = deliver("0", REPLY)
    assert outcome is Outcome.DROPPED
    assert sender.calls == []
    dropped = metrics.registry.get_sample_value("eventing_kafka_dropped_total",
                                                {**LABELS.as_dict(), "reason": "ttl_expired"})
    assert dropped == 1.0
