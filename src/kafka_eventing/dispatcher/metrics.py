"""The dispatcher's Prometheus metrics (one set per registry, so tests can run several dispatchers).

``eventing_kafka_consumed_msg_count{consumer,partition,topic}`` keeps the name the distributed KafkaChannel's
README showed, so existing dashboards keep working.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

SUB = ("namespace", "channel", "subscriber")


class Labels(NamedTuple):
    namespace: str
    channel: str
    subscriber: str

    def as_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "channel": self.channel, "subscriber": self.subscriber}


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.consumed = Counter(
            "eventing_kafka_consumed_msg_count", "Records consumed from Kafka.",
            ("consumer", "partition", "topic"), registry=registry)
        self.deliveries = Counter(
            "eventing_kafka_dispatch_attempts", "HTTP delivery attempts by response code ('none' = no response).",
            (*SUB, "code"), registry=registry)
        self.retries = Counter("eventing_kafka_dispatch_retries", "Delivery retries.", SUB, registry=registry)
        self.dead_lettered = Counter(
            "eventing_kafka_dead_lettered", "Events accepted by the dead-letter sink.", SUB, registry=registry)
        self.sink_retries = Counter(
            "eventing_kafka_dead_letter_retries", "Retries of a failing dead-letter sink.", SUB, registry=registry)
        self.dropped = Counter(
            "eventing_kafka_dropped", "Events given up without delivery (final failure and no sink, or not a "
            "CloudEvent).", (*SUB, "reason"), registry=registry)
        self.fell_behind = Counter(
            "eventing_kafka_trigger_fell_behind", "Times a Broker's Trigger held the shared read back past the "
            "window and went on reading on its own.", SUB, registry=registry)
        self.filtered = Counter(
            "eventing_kafka_filtered_out", "Events a Trigger's filter rejected (committed without delivery).", SUB,
            registry=registry)
        self.replies = Counter("eventing_kafka_replies", "Replies forwarded to replyUri.", SUB, registry=registry)
        self.outcomes = Counter(
            "eventing_kafka_dispatch_outcomes", "Events finished, by outcome (delivered, dead_lettered, dropped).",
            (*SUB, "outcome"), registry=registry)
        self.latency = Histogram(
            "eventing_kafka_dispatch_latency_seconds", "Time from first attempt to the final subscriber answer.",
            SUB, registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        self.lag = Gauge(
            "eventing_kafka_consumer_lag", "High watermark minus the committable position, per partition.",
            ("consumer", "partition", "topic"), registry=registry)
        self.in_flight = Gauge("eventing_kafka_dispatch_in_flight", "Events being delivered.", SUB, registry=registry)
        self.ready = Gauge(
            "eventing_kafka_dispatcher_ready", "1 while the dispatcher is ready (channel found, every consumer "
            "group joined), as its /readyz answers.", ("namespace", "channel"), registry=registry)


_lock = threading.Lock()
_by_registry: dict[int, Metrics] = {}


def metrics_for(registry: CollectorRegistry | None = None) -> Metrics:
    registry = REGISTRY if registry is None else registry
    with _lock:
        found = _by_registry.get(id(registry))
        if found is None or found.registry is not registry:
            found = _by_registry[id(registry)] = Metrics(registry)
        return found
