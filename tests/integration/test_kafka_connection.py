"""Core Kafka config against the real broker: both listeners, and a wrong password fails fast and clean."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_eventing.core.kafka_config import (
    KafkaConnectionError,
    check_connection,
    connection_from_secret,
)
from kafka_eventing.localstack.kafka import KafkaNode

pytestmark = pytest.mark.kafka


def _roundtrip(config: dict[str, object], producer_config: dict[str, object]) -> list[bytes]:
    topic = f"conn.{uuid.uuid4().hex[:10]}"
    admin = AdminClient(config)
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(timeout=30)
    producer = Producer(producer_config)
    payloads = [f"m{i}".encode() for i in range(5)]
    for p in payloads:
        producer.produce(topic, p)
    assert producer.flush(15) == 0
    consumer = Consumer({**config, "group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(payloads) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value())
    consumer.close()
    return got


@pytest.mark.parametrize("sasl_ssl", [False, True], ids=["plaintext", "sasl_ssl_scram512"])
def test_produce_consume_through_secret_config(kafka_running: KafkaNode, sasl_ssl: bool) -> None:
    conn = connection_from_secret(kafka_running.connection_secret(sasl_ssl=sasl_ssl))
    if sasl_ssl:
        assert conn.config["security.protocol"] == "SASL_SSL"
        assert conn.config["sasl.mechanism"] == "SCRAM-SHA-512"
    check_connection(conn, timeout=20)
    got = _roundtrip(conn.admin_config(), conn.producer_config())
    assert got == [f"m{i}".encode() for i in range(5)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_other_sasl_mechanisms(kafka_running: KafkaNode, mechanism: str) -> None:
    secret = {**kafka_running.connection_secret(sasl_ssl=True), "sasl.mechanism": mechanism}
    conn = connection_from_secret(secret)
    check_connection(conn, timeout=20)


def test_wrong_password_fails_fast_without_leaking(
    kafka_running: KafkaNode, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-" + uuid.uuid4().hex
    secret = {**kafka_running.connection_secret(sasl_ssl=True), "password": wrong}
    conn = connection_from_secret(secret)
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(KafkaConnectionError) as err:
        check_connection(conn, timeout=120)
    elapsed = time.monotonic() - started
    # Fast: the refusal ends the wait, long before the timeout would (without it, 120 s and "did not answer").
    assert elapsed < 60, f"auth failure took {elapsed:.1f}s to surface"
    assert "refused" in str(err.value) or "authentic" in str(err.value).lower()
    assert wrong not in str(err.value)
    assert wrong not in repr(conn)
    assert wrong not in caplog.text


def test_unreachable_broker_reports_clearly() -> None:
    conn = connection_from_secret({"bootstrap.servers": "127.0.0.1:1"})
    with pytest.raises(KafkaConnectionError, match="did not answer"):
        check_connection(conn, timeout=3)


def test_broker_restart_on_same_data(kafka_running: KafkaNode, topic: str) -> None:
    producer = Producer(kafka_running.client_config())
    producer.produce(topic, b"before", partition=0)
    assert producer.flush(10) == 0
    kafka_running.stop()
    assert not kafka_running.running
    kafka_running.start()
    consumer = Consumer({**kafka_running.client_config(), "group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    value = None
    while value is None and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            value = msg.value()
    consumer.close()
    assert value == b"before"
