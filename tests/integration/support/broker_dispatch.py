"""A Broker's dispatcher run in-process over a Broker and Triggers written to files: the Broker and Trigger
objects, a running dispatcher, replies from a subscriber, and when a drain ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.dispatcher.broker_dispatcher import BrokerDispatcher
from kafka_eventing.dispatcher.status import KubeTriggerStatusWriter
from kafka_eventing.dispatcher.triggers import FileTriggerSource, KubeTriggerSource
from kafka_eventing.localstack.kafka import KafkaNode
from support.dispatcher import KAFKA_EXTRA, InProcess, Received
from waiting import wait_for

PONG = {"ce-specversion": "1.0", "ce-id": "pong-1", "ce-source": "/replier", "ce-type": "com.example.pong",
        "content-type": "text/plain"}


def reply_with(headers: dict[str, str]) -> Callable[[Received, int], tuple[int, dict[str, str], bytes, float]]:
    return lambda _r, _a: (200, headers, b"pong", 0.0)


class RunningDispatcher:
    def __init__(self, settings: Settings, source: KubeTriggerSource, writer: KubeTriggerStatusWriter,
                 **options: Any) -> None:
        self.dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                            status_writer=writer, registry=CollectorRegistry(), host="127.0.0.1",
                                            port=0, **options)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.dispatcher.run()), daemon=True)
        self.thread.start()

    def metric(self, name: str, **labels: str) -> float:
        registry = self.dispatcher.metrics.registry
        return registry.get_sample_value(name, labels) or 0.0

    def stop(self) -> None:
        self.dispatcher.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()






NS = "default"


BROKER = "b"


def write_broker(path: Path, topic: str, triggers: list[dict[str, Any]]) -> None:
    docs: list[dict[str, Any]] = [{
        "apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
        "metadata": {"name": BROKER, "namespace": NS, "annotations": {
            kb.ANNOTATION_BROKER_CLASS: "Kafka", kb.ANNOTATION_EXTERNAL_TOPIC: topic}}, "spec": {}}]
    docs += triggers
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(docs))
    tmp.replace(path)


def trigger(name: str, uri: str, *, ordered: bool = False, filters: list[dict[str, Any]] | None = None,
            delivery: dict[str, Any] | None = None) -> dict[str, Any]:
    annotations = {kb.ANNOTATION_DELIVERY_ORDER: "ordered"} if ordered else {}
    spec: dict[str, Any] = {"broker": BROKER, "subscriber": {"uri": uri}}
    if filters:
        spec["filters"] = filters
    if delivery:
        spec["delivery"] = delivery
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
            "metadata": {"name": name, "namespace": NS, "generation": 1, "annotations": annotations}, "spec": spec}


@pytest.fixture
def broker_dispatch(kafka_running: KafkaNode) -> Iterator[Callable[..., InProcess]]:
    started: list[InProcess] = []

    def make(path: Path, *, window: float = 5.0, **settings_kw: Any) -> InProcess:
        settings = Settings(bootstrap_servers=kafka_running.bootstrap_servers, broker_namespace=NS,
                            broker_name=BROKER, channels_file=path, log_level="WARNING",
                            kafka_extra=KAFKA_EXTRA, **settings_kw)
        source = FileTriggerSource(path, settings, NS, BROKER, poll_interval=0.1)
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                       registry=CollectorRegistry(), host="127.0.0.1", port=0, window=window)
        assert isinstance(dispatcher, BrokerDispatcher)
        running = InProcess(dispatcher, source).start()
        started.append(running)
        wait_for(running.ready, 30, "the shared reader joined and every Trigger placed")
        return running

    try:
        yield make
    finally:
        for running in started:
            if running.thread.is_alive():
                running.stop()


def ends(kafka: KafkaNode, topic: str) -> list[int]:

    consumer = Consumer({**kafka.client_config(), "group.id": "probe"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)]
    finally:
        consumer.close()
