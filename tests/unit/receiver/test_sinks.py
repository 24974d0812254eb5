"""Receiver serving KafkaSinks on /<namespace>/<name> of the sink ingress Service (fakes for Kafka and sources)."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_eventing.core import brokers as kb
from kafka_eventing.core import sinks as ks
from kafka_eventing.core.binding import ContentMode
from kafka_eventing.core.channels import Channel
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.app import create_app
from kafka_eventing.receiver.sender import KafkaSender

from .fakes import BINARY, Client, FakeChannels, FakeProducer

BROKER = Channel("shop", "orders", kb.broker_topic("shop", "orders"), ordered=False)
SINK = Channel("shop", "orders", "orders-topic", ordered=False)
STRUCTURED = Channel("shop", "audit", "audit-topic", ordered=False, content_mode=ContentMode.STRUCTURED)
COLD = Channel("shop", "cold", "cold-topic", ready=False, reason="topic 'cold-topic' does not exist")
SINK_HOST = "kafka-sink-ingress.knative-eventing.svc.cluster.local"
RECEIVER_HOST = "kafka-channel-receiver.knative-eventing.svc.cluster.local"


def make(producer: FakeProducer) -> tuple[Client, KafkaSender]:
    settings = Settings(produce_timeout_seconds=0.3, max_event_bytes=4096, retry_after_seconds=7)
    sender = KafkaSender(producer, timeout=settings.produce_timeout_seconds)
    app = create_app(producer, FakeChannels(), settings, sender=sender, brokers=FakeChannels(BROKER),
                     sinks=FakeChannels(SINK, STRUCTURED, COLD))
    return Client(app), sender


def post(client: Client, path: str, host: str = SINK_HOST, body: bytes = b'{"n":1}', **headers: str) -> Any:
    return client.simulate_post(path, body=body, headers={**BINARY, "Host": host, **headers})


@pytest.mark.parametrize("host", [SINK_HOST, "kafka-sink-ingress", "kafka-sink-ingress:8080",
                                  "KAFKA-SINK-INGRESS.knative-eventing.svc"])
def test_the_sink_host_reaches_the_sink_and_the_receiver_host_the_broker_of_the_same_name(host: str) -> None:
    producer = FakeProducer()
    client, sender = make(producer)
    try:
        assert post(client, "/shop/orders", host).status_code == 202
        assert producer.produced[-1].topic == "orders-topic"
        assert post(client, "/shop/orders", RECEIVER_HOST).status_code == 202
        assert producer.produced[-1].topic == "knative-broker-shop-orders"
    finally:
        sender.close(1.0)


def test_sink_answers_404_503_400_413_as_channels_do() -> None:
    producer = FakeProducer()
    client, sender = make(producer)
    try:
        missing = post(client, "/shop/nope")
        assert missing.status_code == 404 and "KafkaSink shop/nope not found" in missing.json["error"]
        # A sink's name on the receiver's own address is no sink (and no Broker either).
        assert post(client, "/shop/audit", RECEIVER_HOST).status_code == 404
        cold = post(client, "/shop/cold")
        assert cold.status_code == 503 and cold.headers["Retry-After"] == "7"
        assert "KafkaSink shop/cold is not ready: topic 'cold-topic' does not exist" in cold.json["error"]
        assert post(client, "/shop/orders", **{"ce-specversion": "0.1"}).status_code == 400
        assert post(client, "/shop/orders", body=b"x" * 5000).status_code == 413
        assert not producer.produced
    finally:
        sender.close(1.0)


def test_kafka_down_is_503_for_a_sink() -> None:
    producer = FakeProducer(mode="error")
    client, sender = make(producer)
    try:
        answer = post(client, "/shop/orders")
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "7"
    finally:
        sender.close(1.0)


def test_structured_sink_writes_the_event_in_the_value() -> None:
    producer = FakeProducer()
    client, sender = make(producer)
    try:
        assert post(client, "/shop/audit").status_code == 202
        record = producer.produced[-1]
        assert record.topic == "audit-topic"
        assert dict(record.headers)["content-type"] == b"application/cloudevents+json"
    finally:
        sender.close(1.0)


def test_sink_ingress_from_the_resource() -> None:
    obj: dict[str, Any] = {"metadata": {"namespace": "shop", "name": "s", "generation": 2},
                           "spec": {"topic": "t", "contentMode": "structured"},
                           "status": {"conditions": [{"type": "TopicReady", "status": "False",
                                                      "reason": "TopicNotFound", "message": "topic 't' missing"}]}}
    sink = ks.sink_ingress(obj)
    assert sink is not None and not sink.ready and sink.reason == "topic 't' missing"
    assert sink.content_mode is ContentMode.STRUCTURED and sink.topic == "t" and sink.connection is None
    assert sink.token_audience == "eventing.knative.dev/kafkasink/shop/s"
    unreconciled = ks.sink_ingress({**obj, "status": {}})
    assert unreconciled is not None and not unreconciled.ready
    standalone = ks.sink_ingress({**obj, "status": {}}, reconciled=False)
    assert standalone is not None and standalone.ready
    assert ks.sink_ingress({**obj, "spec": {"topic": "t", "contentMode": "json"}}) is None
    assert ks.is_sink_host("kafka-sink-ingress.ns.svc:80", "kafka-sink-ingress")
    assert ks.is_sink_host("Kafka-Sink-Ingress:80", "kafka-sink-ingress")
    assert not ks.is_sink_host("kafka-sink-ingress-x.ns.svc", "kafka-sink-ingress")
