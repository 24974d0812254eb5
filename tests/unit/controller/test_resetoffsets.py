"""The ResetOffset reconciler (controller/resetoffsets.py) on fakes: ref resolution, refusals with reasons, done
once. On the real apiserver: tests/integration/test_resetoffset.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from kafka_eventing.controller.api import LostLeadership
from kafka_eventing.controller.resetoffsets import ResetOffsetReconciler
from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core.settings import Settings

SUB_REF = {"apiVersion": "messaging.knative.dev/v1", "kind": "Subscription", "name": "s"}
TRIGGER_REF = {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "name": "t"}


def reset(name: str = "r", *, ref: Mapping[str, Any] = SUB_REF, time: str = "earliest", generation: int = 1,
          status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "generation": generation, "resourceVersion": "7"},
            "spec": {"offset": {"time": time}, "ref": dict(ref)}, "status": dict(status or {})}


class Store:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objs.get(name)

    def items(self) -> list[Mapping[str, Any]]:
        return list(self.objs.values())


class Patches:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.bodies: list[dict[str, Any]] = []

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: dict[str, Any], **_: Any) -> None:
        assert (group, version, plural) == (ro.GROUP, ro.VERSION, ro.PLURAL)
        assert body["metadata"]["resourceVersion"] == "7"
        self.bodies.append(body)
        self.store.objs[name]["status"] = {k: v for k, v in body["status"].items() if v is not None}


OBJECTS: dict[tuple[str, str], dict[str, Any]] = {
    ("subscriptions", "s"): {"metadata": {"uid": "u-1"},
                             "spec": {"channel": {"apiVersion": "messaging.knative.dev/v1beta1",
                                                  "kind": "KafkaChannel", "name": "kc"}}},
    ("subscriptions", "imc"): {"metadata": {"uid": "u-2"},
                               "spec": {"channel": {"kind": "InMemoryChannel", "name": "imc"}}},
    ("kafkachannels", "kc"): {"metadata": {"name": "kc", "namespace": "ns"}, "spec": {"numPartitions": 3}},
    ("triggers", "t"): {"spec": {"broker": "kafka"}},
    ("triggers", "mt"): {"spec": {"broker": "mt"}},
    ("brokers", "kafka"): {"metadata": {"name": "kafka", "namespace": "ns",
                                        "annotations": {"eventing.knative.dev/broker.class": "Kafka"}}},
    ("kafkasources", "src"): {"metadata": {"name": "src", "namespace": "ns", "uid": "u-3"},
                              "spec": {"bootstrapServers": ["k:9092"], "topics": ["t1", "t2"],
                                       "consumerGroup": "my-group", "sink": {"uri": "http://sink/"}}},
    ("kafkasources", "broken"): {"metadata": {"name": "broken", "namespace": "ns", "uid": "u-4"},
                                 "spec": {"bootstrapServers": ["k:9092"], "topics": []}},
    ("brokers", "mt"): {"metadata": {"name": "mt", "namespace": "ns",
                                     "annotations": {"eventing.knative.dev/broker.class": "MTChannelBasedBroker"}}},
}


def read(group: str, version: str, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return OBJECTS.get((plural, name))


def reconciler(*objs: dict[str, Any], leader: bool = True) -> tuple[ResetOffsetReconciler, Patches, Store]:
    store = Store(*objs)
    rec = ResetOffsetReconciler(client.ApiClient(), Settings(), store, lambda: leader, read=read)
    patches = Patches(store)
    rec.api.api = patches  # type: ignore[assignment]
    return rec, patches, store


def conditions(store: Store, name: str = "r") -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in store.objs[name]["status"]["conditions"]}


def test_subscription_resolves_to_its_channel_group_and_dispatcher() -> None:
    rec, patches, store = reconciler(reset())
    rec.reconcile("ns", "r")
    status = store.objs["r"]["status"]
    assert status["target"] == {"group": Settings().consumer_group_for("ns", "kc", "u-1"), "topics": ["ns.kc"],
                                "dispatcher": {"kind": "KafkaChannel", "namespace": "ns", "name": "kc"}}
    assert status["observedGeneration"] == 1
    assert conditions(store) == {ro.ACCEPTED: ("True", ro.REASON_ACCEPTED),
                                 ro.RESETTING: ("Unknown", ro.REASON_WAITING), ro.DONE: ("Unknown", ro.REASON_WAITING)}
    assert ro.pending_target(store.objs["r"]) is not None
    rec.reconcile("ns", "r")  # a resync: nothing written again
    assert len(patches.bodies) == 1


def test_trigger_of_a_kafka_broker_resolves_to_its_trigger_group() -> None:
    rec, _, store = reconciler(reset(ref=TRIGGER_REF))
    rec.reconcile("ns", "r")
    target = store.objs["r"]["status"]["target"]
    assert target["group"] == "knative-trigger-ns-t" and target["topics"] == ["knative-broker-ns-kafka"]
    assert target["dispatcher"] == {"kind": "Broker", "namespace": "ns", "name": "kafka"}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_kafka_source_resolves_to_its_consumer_group_over_all_its_topics(version: str) -> None:
    rec, _, store = reconciler(reset(ref={"apiVersion": f"sources.knative.dev/{version}", "kind": "KafkaSource",
                                          "name": "src"}))
    rec.reconcile("ns", "r")
    assert store.objs["r"]["status"]["target"] == {
        "group": "my-group", "topics": ["t1", "t2"],
        "dispatcher": {"kind": "KafkaSource", "namespace": "ns", "name": "src"}}
    assert conditions(store)[ro.ACCEPTED] == ("True", ro.REASON_ACCEPTED)


@pytest.mark.parametrize(("ref", "time", "reason"), [
    ({**SUB_REF, "name": "missing"}, "earliest", ro.REASON_REF_NOT_FOUND),
    ({**SUB_REF, "name": "imc"}, "earliest", ro.REASON_UNSUPPORTED_REF),
    ({**TRIGGER_REF, "name": "mt"}, "earliest", ro.REASON_NOT_KAFKA),
    ({**TRIGGER_REF, "name": "missing"}, "earliest", ro.REASON_REF_NOT_FOUND),
    ({"apiVersion": "sources.knative.dev/v1beta1", "kind": "KafkaSource", "name": "k"}, "latest",
     ro.REASON_REF_NOT_FOUND),
    ({"apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource", "name": "broken"}, "latest",
     ro.REASON_INVALID_REF),
    ({**SUB_REF, "namespace": "elsewhere"}, "earliest", ro.REASON_UNSUPPORTED_REF),
    ({"apiVersion": "v1", "kind": "Pod", "name": "p"}, "latest", ro.REASON_UNSUPPORTED_REF),
    (SUB_REF, "2026-11-26", ro.REASON_INVALID_TIME),
])
def test_refusals_have_a_reason_and_are_final(ref: Mapping[str, Any], time: str, reason: str) -> None:
    rec, patches, store = reconciler(reset(ref=ref, time=time))
    rec.reconcile("ns", "r")
    assert conditions(store) == {ro.ACCEPTED: ("False", reason), ro.DONE: ("False", reason)}
    assert "target" not in store.objs["r"]["status"]
    assert ro.is_finished(store.objs["r"])
    rec.reconcile("ns", "r")
    assert len(patches.bodies) == 1


def test_second_reset_of_a_group_while_one_is_pending_is_refused() -> None:
    rec, _, store = reconciler(reset("first"), reset("second", time="latest"))
    rec.reconcile("ns", "first")
    rec.reconcile("ns", "second")
    assert conditions(store, "second")[ro.ACCEPTED] == ("False", ro.REASON_IN_PROGRESS)
    assert "first" in store.objs["second"]["status"]["conditions"][0]["message"]


def test_completed_generation_is_not_looked_at_again_but_an_edit_is_a_new_reset() -> None:
    done = {"observedGeneration": 1, "completedGeneration": 1, "partitions": [{"partition": 0, "old": 1, "new": 0}],
            "conditions": [{"type": ro.DONE, "status": "True", "reason": ro.REASON_DONE}]}
    rec, patches, store = reconciler(reset(status=done))
    rec.reconcile("ns", "r")
    assert patches.bodies == []
    store.objs["r"]["metadata"]["generation"] = 2
    rec.reconcile("ns", "r")
    status = store.objs["r"]["status"]
    assert status["observedGeneration"] == 2 and "partitions" not in status
    assert conditions(store)[ro.DONE] == ("Unknown", ro.REASON_WAITING)


def test_only_the_leader_writes() -> None:
    rec, patches, _ = reconciler(reset(), leader=False)
    with pytest.raises(LostLeadership):
        rec.reconcile("ns", "r")
    assert patches.bodies == []
