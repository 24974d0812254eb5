"""Receiver serving Kafka Brokers on /<namespace>/<name> beside KafkaChannels (fakes for Kafka and the sources)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kafka_eventing.core import brokers as kb
from kafka_eventing.core import tracing
from kafka_eventing.core.channels import Channel
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.app import create_app
from kafka_eventing.receiver.sender import KafkaSender

from .fakes import BINARY, Client, FakeChannels, FakeProducer

CHANNEL = Channel("shop", "orders", "shop.orders")
BROKER = Channel("shop", "orders", kb.broker_topic("shop", "orders"), ordered=False)
ONLY_BROKER = Channel("shop", "default", kb.broker_topic("shop", "default"), ordered=False)
NOT_READY = Channel("shop", "cold", kb.broker_topic("shop", "cold"), ready=False, reason="topic missing")


def make(producer: FakeProducer, brokers: FakeChannels | None) -> tuple[Client, KafkaSender]:
    settings = Settings(produce_timeout_seconds=0.3, max_event_bytes=4096, retry_after_seconds=7)
    sender = KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    app = create_app(producer, FakeChannels(CHANNEL), settings, sender=sender, brokers=brokers)
    return Client(app), sender


def post(client: Client, path: str, host: str = "receiver.knative-eventing.svc") -> Any:
    return client.simulate_post(path, body=b'{"n":1}', headers={**BINARY, "Host": host})


def test_path_reaches_the_broker_and_host_the_channel_of_the_same_name() -> None:
    producer = FakeProducer()
    client, sender = make(producer, FakeChannels(BROKER, ONLY_BROKER, NOT_READY))
    try:
        assert post(client, "/shop/orders").status_code == 202
        assert producer.produced[-1].topic == "knative-broker-shop-orders"
        assert post(client, "/", host="orders-kn-channel.shop.svc.cluster.local").status_code == 202
        assert producer.produced[-1].topic == "shop.orders"
        assert post(client, "/shop/default").status_code == 202
        assert producer.produced[-1].topic == "knative-broker-shop-default"
        cold = post(client, "/shop/cold")
        assert cold.status_code == 503 and cold.headers["Retry-After"] == "7"
        assert "broker shop/cold is not ready: topic missing" in cold.json["error"]
        missing = post(client, "/shop/nope")
        assert missing.status_code == 404 and "channel or broker shop/nope" in missing.json["error"]
        assert len(producer.produced) == 3
    finally:
        sender.close(1.0)


def test_the_routes_follow_what_the_sources_publish() -> None:
    # The request path reads tables built from the sources; a new set replaces them at once.
    producer = FakeProducer()
    brokers = FakeChannels()
    client, sender = make(producer, brokers)
    try:
        assert post(client, "/shop/orders").status_code == 202  # the channel, while no Broker has the name
        assert producer.produced[-1].topic == "shop.orders"
        brokers.publish(NOT_READY, Channel("shop", "orders", BROKER.topic, ready=False, reason="no topic yet"))
        cold = post(client, "/shop/orders")
        assert cold.status_code == 503 and "broker shop/orders is not ready: no topic yet" in cold.json["error"]
        brokers.publish(BROKER, NOT_READY)
        assert post(client, "/shop/orders").status_code == 202
        assert producer.produced[-1].topic == "knative-broker-shop-orders"
        assert post(client, "/shop/cold").status_code == 503
        brokers.publish()  # every Broker deleted: the path is the channel's again, and the Broker's name a 404
        assert post(client, "/shop/orders").status_code == 202
        assert producer.produced[-1].topic == "shop.orders"
        assert post(client, "/shop/cold").status_code == 404
    finally:
        sender.close(1.0)


def test_kafka_down_is_503_for_a_broker_too() -> None:
    producer = FakeProducer(mode="error")
    client, sender = make(producer, FakeChannels(BROKER))
    try:
        answer = post(client, "/shop/orders")
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "7"
    finally:
        sender.close(1.0)


def test_without_a_broker_source_the_path_is_the_channel() -> None:
    producer = FakeProducer()
    client, sender = make(producer, None)
    try:
        assert post(client, "/shop/orders").status_code == 202
        assert producer.produced[-1].topic == "shop.orders"
    finally:
        sender.close(1.0)


def broker_obj(cls: str = "Kafka", conditions: list[dict[str, str]] | None = None,
               **annotations: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "shop", "name": "orders", "generation": 2, "uid": "u-1",
                         "annotations": {kb.ANNOTATION_BROKER_CLASS: cls, **annotations}},
            "status": {"conditions": conditions or []}}


def test_broker_ingress_from_the_resource() -> None:
    assert kb.broker_ingress(broker_obj("MTChannelBasedBroker")) is None
    fresh = kb.broker_ingress(broker_obj())
    assert fresh is not None and not fresh.ready and "not reconciled yet" in fresh.reason
    failing = kb.broker_ingress(broker_obj(conditions=[{"type": "TopicReady", "status": "False",
                                                        "reason": "TopicNotFound", "message": "no topic x"}]))
    assert failing is not None and not failing.ready and failing.reason == "no topic x"
    ready = kb.broker_ingress(broker_obj(conditions=[{"type": "TopicReady", "status": "True"},
                                                     {"type": "Ready", "status": "False"}]))
    assert ready is not None and ready.ready and ready.topic == "knative-broker-shop-orders"
    external = kb.broker_ingress(broker_obj(**{kb.ANNOTATION_EXTERNAL_TOPIC: "legacy.events"}))
    assert external is not None and external.topic == "legacy.events"


def test_a_brokers_token_audience_is_the_brokers_not_a_channels() -> None:
    plain = kb.broker_ingress(broker_obj())
    assert plain is not None and plain.token_audience == "eventing.knative.dev/broker/shop/orders"
    published = broker_obj()
    published["status"]["address"] = {"url": "http://x/shop/orders", "audience": "my-audience"}
    custom = kb.broker_ingress(published)
    assert custom is not None and custom.token_audience == "my-audience"


def test_the_produce_span_names_a_broker_or_a_channel() -> None:
    keep = InMemorySpanExporter()
    traces = tracing.setup(Settings(), "receiver", exporter=keep)
    assert traces is not None
    producer = FakeProducer()
    sender = KafkaSender(producer, timeout=0.3)
    # A Broker and a KafkaChannel of the same namespace and name: the path reaches the one, the Host the other.
    app = create_app(producer, FakeChannels(CHANNEL), Settings(), sender=sender, brokers=FakeChannels(BROKER),
                     tracer=traces.tracer)
    client = Client(app)
    try:
        assert post(client, "/shop/orders").status_code == 202
        assert post(client, "/", host="orders-kn-channel.shop.svc.cluster.local").status_code == 202
    finally:
        sender.close(1.0)
        traces.shutdown()
    to_broker, to_channel = [s.attributes for s in keep.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    assert to_broker["kafka_eventing.broker"] == "shop/orders" and "kafka_eventing.channel" not in to_broker
    assert to_broker["messaging.destination.name"] == "knative-broker-shop-orders"
    assert to_channel["kafka_eventing.channel"] == "shop/orders" and "kafka_eventing.broker" not in to_channel
