"""The readiness gauges the controller exports, read from its caches at scrape time."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from kafka_eventing.controller.brokers import BrokerReadiness
from kafka_eventing.controller.channels import ChannelReadiness
from kafka_eventing.core import brokers as kb

from .fakes import DictStore


def _obj(name: str, ready: str | None, reason: str = "", *, spec: dict[str, Any] | None = None,
         broker_class: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name}
    if broker_class is not None:
        meta["annotations"] = {kb.ANNOTATION_BROKER_CLASS: broker_class}
    status = {"conditions": [{"type": "Ready", "status": ready, "reason": reason}]} if ready else {}
    return {"metadata": meta, "spec": spec or {}, "status": status}


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for m in registry.collect() for s in m.samples
            if s.name == name}


def test_broker_and_trigger_readiness_with_reasons() -> None:
    brokers = DictStore(_obj("good", "True", broker_class="Kafka"),
                        _obj("bad", "False", "TopicNotReady", broker_class="kafka"),
                        _obj("new", None, broker_class="Kafka"),
                        _obj("mt", "True", broker_class="MTChannelBasedBroker"))
    triggers = DictStore(_obj("t-good", "True", spec={"broker": "good"}),
                         _obj("t-bad", "False", "SubscriberResolved", spec={"brokerRef": {"name": "bad"}}),
                         _obj("t-orphan", "False", "BrokerDoesNotExist", spec={"broker": "missing"}),
                         _obj("t-mt", "True", spec={"broker": "mt"}))
    registry = CollectorRegistry()
    registry.register(BrokerReadiness(brokers, triggers))  # type: ignore[arg-type]

    assert _samples(registry, "kafka_broker_ready") == {
        (("name", "good"), ("namespace", "ns"), ("reason", "")): 1.0,
        (("name", "bad"), ("namespace", "ns"), ("reason", "TopicNotReady")): 0.0,
        (("name", "new"), ("namespace", "ns"), ("reason", "NotReconciled")): 0.0,
    }  # the MTChannelBasedBroker belongs to another implementation
    assert _samples(registry, "kafka_trigger_ready") == {
        (("broker", "good"), ("name", "t-good"), ("namespace", "ns"), ("reason", "")): 1.0,
        (("broker", "bad"), ("name", "t-bad"), ("namespace", "ns"), ("reason", "SubscriberResolved")): 0.0,
        (("broker", "missing"), ("name", "t-orphan"), ("namespace", "ns"), ("reason", "BrokerDoesNotExist")): 0.0,
    }

    # Read at scrape time: a status the watch brings in shows at the next scrape.
    brokers.objs[("ns", "bad")] = _obj("bad", "True", broker_class="Kafka")
    assert _samples(registry, "kafka_broker_ready")[(("name", "bad"), ("namespace", "ns"), ("reason", ""))] == 1.0


def test_channel_readiness() -> None:
    registry = CollectorRegistry()
    registry.register(ChannelReadiness(DictStore(_obj("c", "False", "TopicNotReady"))))  # type: ignore[arg-type]
    assert _samples(registry, "kafkachannel_ready") == {
        (("name", "c"), ("namespace", "ns"), ("reason", "TopicNotReady")): 0.0}
