"""The CRDs' own validation on a real kube-apiserver: what `kubectl apply` refuses, with the field named, before any
controller sees the object; what it defaults into the spec; which fields an update may not change.

One case per rule: the invalid object refused (422, the message naming the field and what is allowed) beside its
valid counterpart, accepted; each immutable field's update refused. No controller runs: this is the API server
alone, with the CRDs of src/kafka_eventing/controller/crds/ (the files `make generate` copies into the chart and
the Kustomize base), so the tests also prove that every CEL rule fits the API server's cost budget.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from fixtures.kube import wait_established
from kafka_eventing.controller.crd import BROKER_CRDS, CHANNEL_CRD, SINK_CRDS, SOURCE_CRD, crd_manifest, install_crd
from kafka_eventing.controller.main import api_client
from kafka_eventing.localstack.kube import KubeControlPlane

pytestmark = [pytest.mark.kube]

MERGE = "application/merge-patch+json"
FILES = (CHANNEL_CRD, *BROKER_CRDS, *SINK_CRDS, SOURCE_CRD, "eventpolicies.yaml")

#: kind → (group, version, plural, a valid spec).
KINDS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "KafkaChannel": ("messaging.knative.dev", "v1beta1", "kafkachannels", {}),
    "Broker": ("eventing.knative.dev", "v1", "brokers", {}),
    "Trigger": ("eventing.knative.dev", "v1", "triggers", {"broker": "default", "subscriber": {"uri": "http://s"}}),
    "KafkaSink": ("eventing.knative.dev", "v1alpha1", "kafkasinks", {"topic": "orders"}),
    "KafkaSource": ("sources.knative.dev", "v1", "kafkasources",
                    {"bootstrapServers": ["kafka:9092"], "topics": ["orders"], "sink": {"uri": "http://s"}}),
    "EventPolicy": ("eventing.knative.dev", "v1alpha1", "eventpolicies", {}),
}
SA = {"apiVersion": "v1", "kind": "ServiceAccount", "name": "sender"}
BROKER = {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": "b"}


@pytest.fixture(scope="module")
def api(kube_control_plane: KubeControlPlane) -> Iterator[client.ApiClient]:
    c = api_client(kube_control_plane.kubeconfig)
    for file in FILES:
        install_crd(c, file=file)
    wait_established(c, [str(crd_manifest(f)["metadata"]["name"]) for f in FILES])
    yield c
    c.close()


class Objects:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom, self.ns = client.CustomObjectsApi(api), namespace

    def create(self, kind: str, spec: dict[str, Any], name: str = "") -> dict[str, Any]:
        group, version, plural, _ = KINDS[kind]
        body = {"apiVersion": f"{group}/{version}", "kind": kind,
                "metadata": {"name": name or f"o-{uuid.uuid4().hex[:8]}", "namespace": self.ns}, "spec": spec}
        return dict(self.custom.create_namespaced_custom_object(group, version, self.ns, plural, body))

    def patch(self, kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        group, version, plural, _ = KINDS[kind]
        return dict(self.custom.patch_namespaced_custom_object(group, version, self.ns, plural, name,
                                                               {"spec": spec}, _content_type=MERGE))


@pytest.fixture
def objects(api: client.ApiClient, kube_namespace: str) -> Objects:
    return Objects(api, kube_namespace)


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, nested objects merged (a value of None removes the key)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def refused(info: pytest.ExceptionInfo[ApiException], field: str, *allowed: str) -> str:
    """The API server's message, checked: 422, naming ``field`` and each text in ``allowed``."""
    assert info.value.status == 422, info.value.body
    message = str(json.loads(info.value.body)["message"])
    assert f"{field}: " in message, message
    for text in allowed:
        assert text in message, message
    return message


# -- the DeliverySpec, wherever it is: (kind, where in the spec, the field path the server reports) -------------

DELIVERIES = [
    ("KafkaChannel", "delivery", "spec.delivery"),
    ("KafkaChannel", "subscribers", "spec.subscribers[0].delivery"),
    ("Broker", "delivery", "spec.delivery"),
    ("Trigger", "delivery", "spec.delivery"),
    ("KafkaSource", "delivery", "spec.delivery"),
]
#: (field, an invalid value, a valid one, what the message must say is allowed, the kinds whose CRD has the field).
DELIVERY_RULES = [
    ("retry", -1, 3, ("greater than or equal to 0",), None),
    ("backoffPolicy", "random", "exponential", ('"linear"', '"exponential"'), None),
    ("backoffDelay", "2s", "PT0.2S", ("backoffDelay must be an ISO-8601 duration", "e.g. PT0.2S"), None),
    ("backoffDelay", "P1M", "P1W", ("years and months have no fixed length",), None),
    ("timeout", "PT0S", "PT30S", ("timeout must be a non-zero ISO-8601 duration",), None),
    ("timeout", "PT", "PT1.5M", ("timeout must be a non-zero ISO-8601 duration",), None),
    ("retryAfterMax", "-PT1S", "PT0S", ("retryAfterMax must be an ISO-8601 duration",),
     {"KafkaChannel", "KafkaSource"}),
    ("format", "xml", "json", ('"json"', '"binary"'), {"KafkaChannel", "Trigger"}),
    ("deadLetterSink", {"audience": "a"}, {"uri": "http://dls"}, ("deadLetterSink needs a ref or a uri",), None),
]


def _delivery_spec(kind: str, where: str, delivery: dict[str, Any]) -> dict[str, Any]:
    if where == "subscribers":
        return merged(KINDS[kind][3], {"subscribers": [{"uid": "u1", "subscriberUri": "http://s",
                                                        "delivery": delivery}]})
    return merged(KINDS[kind][3], {"delivery": delivery})


@pytest.mark.parametrize(("kind", "where", "path"), DELIVERIES, ids=[f"{k}-{w}" for k, w, _ in DELIVERIES])
def test_delivery_rules(objects: Objects, kind: str, where: str, path: str) -> None:
    for field, bad, good, allowed, kinds in DELIVERY_RULES:
        if kinds is not None and kind not in kinds:
            continue
        with pytest.raises(ApiException) as info:
            objects.create(kind, _delivery_spec(kind, where, {field: bad}))
        refused(info, f"{path}.{field}", *allowed)
        objects.create(kind, _delivery_spec(kind, where, {field: good}))


# -- one rule of one kind: (kind, spec over the valid one, field, what the message says) ------------------------

FIELD_RULES = [
    ("KafkaChannel", {"numPartitions": 0}, "spec.numPartitions", ("greater than or equal to 1",), {"numPartitions": 3}),
    ("KafkaChannel", {"replicationFactor": 0}, "spec.replicationFactor", ("greater than or equal to 1",),
     {"replicationFactor": 3}),
    ("KafkaChannel", {"retentionDuration": "1 week"}, "spec.retentionDuration", ("should match",),
     {"retentionDuration": "P7D"}),
    ("KafkaChannel", {"retentionDuration": "PT"}, "spec.retentionDuration",
     ("retentionDuration must be an ISO-8601 duration",), {"retentionDuration": "PT1H"}),
    ("KafkaChannel", {"subscribers": [{"uid": "u1", "subscriberUri": "http://s"}, {"uid": "u2"}]},
     "spec.subscribers[1]", ("a subscriber needs a subscriberUri or a replyUri",),
     {"subscribers": [{"uid": "u1", "subscriberUri": "http://s"}, {"uid": "u2", "replyUri": "http://r"}]}),
    ("KafkaSource", {"initialOffset": "oldest"}, "spec.initialOffset", ('"earliest"', '"latest"'),
     {"initialOffset": "earliest"}),
    ("KafkaSource", {"ordering": "random"}, "spec.ordering", ('"ordered"', '"unordered"'), {"ordering": "unordered"}),
    ("KafkaSource", {"consumers": -1}, "spec.consumers", ("greater than or equal to 0",), {"consumers": 0}),
    ("KafkaSource", {"topics": []}, "spec.topics", ("at least 1 items",), {"topics": ["a", "b"]}),
    ("KafkaSource", {"topics": ["a", "bad topic"]}, "spec.topics[1]", ("a Kafka topic name is 1 to 249",),
     {"topics": ["a", "Good_topic-1.x"]}),
    ("KafkaSource", {"topics": ["t" * 250]}, "spec.topics[0]", ("249",), {"topics": ["t" * 249]}),
    ("KafkaSource", {"topics": [".."]}, "spec.topics[0]", ("not '.' or '..'",), {"topics": ["..."]}),
    ("KafkaSource", {"bootstrapServers": []}, "spec.bootstrapServers", ("at least 1 items",),
     {"bootstrapServers": ["a:9092", "b:9092"]}),
    ("KafkaSource", {"sink": {"uri": None, "audience": "a"}}, "spec.sink", ("sink needs a ref or a uri",),
     {"sink": {"uri": None, "ref": {"apiVersion": "v1", "kind": "Service", "name": "s"}}}),
    ("KafkaSink", {"topic": "a/b"}, "spec.topic", ("a Kafka topic name is 1 to 249",), {"topic": "a.b"}),
    ("KafkaSink", {"topic": "t" * 250}, "spec.topic", ("249",), {"topic": "t" * 249}),
    ("KafkaSink", {"contentMode": "json"}, "spec.contentMode", ('"binary"', '"structured"'),
     {"contentMode": "structured"}),
    ("KafkaSink", {"numPartitions": 0}, "spec.numPartitions", ("greater than or equal to 1",), {"numPartitions": 1}),
    ("KafkaSink", {"replicationFactor": 0}, "spec.replicationFactor", ("greater than or equal to 1",),
     {"replicationFactor": 1}),
    ("KafkaSink", {"auth": {"secret": {"ref": {"name": ""}}}}, "spec.auth.secret.ref.name", ("at least 1 chars",),
     {"auth": {"secret": {"ref": {"name": "kafka"}}}}),
    ("Trigger", {"broker": None}, "spec", ("exactly one of them",),
     {"broker": None, "brokerRef": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": "b"}}),
    ("Trigger", {"brokerRef": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": "b"}}, "spec",
     ("exactly one of them",), {"broker": "b"}),
    ("Trigger", {"subscriber": {"uri": None, "audience": "a"}}, "spec.subscriber",
     ("subscriber needs a ref or a uri",),
     {"subscriber": {"uri": None, "ref": {"apiVersion": "v1", "kind": "Service", "name": "s"}}}),
    ("Trigger", {"filters": [{"exact": {"type": "x"}, "cesql": "true"}]}, "spec.filters[0]",
     ("a filter sets one dialect",), {"filters": [{"all": [{"exact": {"type": "x"}}, {"cesql": "true"}]}]}),
    ("EventPolicy", {"from": [{"sub": "a"}, {}]}, "spec.from[1]", ("a from entry names a ref or a sub",),
     {"from": [{"sub": "a"}, {"ref": SA}]}),
    ("EventPolicy", {"from": [{"ref": SA, "sub": "a"}]}, "spec.from[0]", ("names a ref or a sub, not both",),
     {"from": [{"ref": SA}, {"sub": "a"}]}),
    ("EventPolicy", {"from": [{"sub": "system:serviceaccount:*:x"}]}, "spec.from[0].sub",
     ("'*' is only allowed as the last character",), {"from": [{"sub": "system:serviceaccount:ns:*"}]}),
    ("EventPolicy", {"from": [{"ref": {"kind": "ServiceAccount", "name": "a"}}]}, "spec.from[0].ref.apiVersion",
     ("Required value",), {"from": [{"ref": SA}]}),
    ("EventPolicy", {"to": [{}]}, "spec.to[0]", ("a to entry names a ref or a selector, exactly one of them",),
     {"to": [{"ref": BROKER}]}),
    ("EventPolicy", {"to": [{"ref": BROKER, "selector": {"matchLabels": {"a": "b"}}}]}, "spec.to[0]",
     ("exactly one of them",), {"to": [{"selector": {"matchLabels": {"a": "b"}}}]}),
    ("Broker", {"config": {"kind": "ConfigMap"}}, "spec.config.name", ("Required value",),
     {"config": {"apiVersion": "v1", "kind": "ConfigMap", "name": "kafka-broker-config"}}),
]


@pytest.mark.parametrize(("kind", "bad", "field", "allowed", "good"), FIELD_RULES,
                         ids=[f"{r[0]}-{r[2]}-{i}" for i, r in enumerate(FIELD_RULES)])
def test_field_rules(objects: Objects, kind: str, bad: dict[str, Any], field: str, allowed: tuple[str, ...],
                     good: dict[str, Any]) -> None:
    with pytest.raises(ApiException) as info:
        objects.create(kind, merged(KINDS[kind][3], bad))
    refused(info, field, *allowed)
    objects.create(kind, merged(KINDS[kind][3], good))


# -- immutable fields: (kind, spec at creation over the valid one, the update, field, message) -------------------

IMMUTABLE = [
    ("KafkaSink", {}, {"topic": "other"}, "spec.topic", "topic is immutable"),
    ("KafkaSink", {"numPartitions": 3}, {"numPartitions": 4}, "spec.numPartitions", "numPartitions is immutable"),
    ("KafkaSink", {}, {"numPartitions": 4}, "spec.numPartitions", "numPartitions is immutable"),
    ("KafkaSink", {"replicationFactor": 1}, {"replicationFactor": None}, "spec.replicationFactor",
     "replicationFactor is immutable"),
    ("KafkaChannel", {"replicationFactor": 1}, {"replicationFactor": 3}, "spec.replicationFactor",
     "replicationFactor is immutable"),
    ("KafkaChannel", {"numPartitions": 3}, {"numPartitions": 2}, "spec.numPartitions",
     "numPartitions may grow, never shrink"),
    ("KafkaSource", {"consumerGroup": "g1"}, {"consumerGroup": "g2"}, "spec.consumerGroup",
     "consumerGroup is immutable"),
    ("KafkaSource", {}, {"consumerGroup": "g2"}, "spec.consumerGroup", "consumerGroup is immutable"),
    ("KafkaSource", {"consumerGroup": "g1"}, {"consumerGroup": None}, "spec.consumerGroup",
     "consumerGroup is immutable"),
    ("Trigger", {}, {"broker": "other"}, "spec.broker", "broker is immutable"),
    ("Broker", {"config": {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}},
     {"config": {"name": "b"}}, "spec.config", "config is immutable"),
]


@pytest.mark.parametrize(("kind", "initial", "update", "field", "message"), IMMUTABLE,
                         ids=[f"{r[0]}-{r[3]}-{i}" for i, r in enumerate(IMMUTABLE)])
def test_immutable_fields(objects: Objects, kind: str, initial: dict[str, Any], update: dict[str, Any], field: str,
                          message: str) -> None:
    name = objects.create(kind, merged(KINDS[kind][3], initial))["metadata"]["name"]
    with pytest.raises(ApiException) as info:
        objects.patch(kind, name, update)
    refused(info, field, message)


def test_mutable_fields_still_change(objects: Objects) -> None:
    """What the rules leave alone: a channel's partitions grow and its retention changes (this implementation
    alters the topic), delivery changes everywhere, a source scales, a Trigger's filter changes."""
    channel = objects.create("KafkaChannel", {"numPartitions": 2})["metadata"]["name"]
    spec = objects.patch("KafkaChannel", channel, {"numPartitions": 5, "retentionDuration": "PT2H",
                                                   "delivery": {"retry": 2}})["spec"]
    assert (spec["numPartitions"], spec["retentionDuration"], spec["delivery"]) == (5, "PT2H", {"retry": 2})
    source = objects.create("KafkaSource", merged(KINDS["KafkaSource"][3], {"consumerGroup": "g"}))["metadata"]["name"]
    spec = objects.patch("KafkaSource", source, {"consumers": 3, "consumerGroup": "g", "topics": ["orders", "more"],
                                                 "delivery": {"timeout": "PT1M"}})["spec"]
    assert (spec["consumers"], spec["consumerGroup"], spec["topics"]) == (3, "g", ["orders", "more"])
    trigger = objects.create("Trigger", KINDS["Trigger"][3])["metadata"]["name"]
    spec = objects.patch("Trigger", trigger, {"filter": {"attributes": {"type": "x"}}, "broker": "default"})["spec"]
    assert spec["filter"] == {"attributes": {"type": "x"}}
    sink = objects.create("KafkaSink", {"topic": "t", "numPartitions": 1, "replicationFactor": 1})["metadata"]["name"]
    assert objects.patch("KafkaSink", sink, {"contentMode": "structured"})["spec"]["contentMode"] == "structured"


def test_defaults_written_into_the_spec(objects: Objects) -> None:
    """Upstream's defaults a CRD can write (its webhook's SetDefaults). A KafkaSource's consumerGroup is not one of
    them: upstream generates it from a random UUID, which a CRD default cannot; unset, the controller and the
    dispatcher use knative-kafka-source-<uid> (core/kafkasources.py default_group)."""
    source = objects.create("KafkaSource", KINDS["KafkaSource"][3])["spec"]
    assert (source["initialOffset"], source["ordering"], source["consumers"]) == ("latest", "ordered", 1)
    assert "consumerGroup" not in source
    assert objects.create("KafkaSink", {"topic": "t"})["spec"]["contentMode"] == "binary"
    channel = objects.create("KafkaChannel", {})["spec"]
    assert (channel["numPartitions"], channel["replicationFactor"], channel["retentionDuration"]) == (1, 1, "PT168H")


def test_the_documented_manifests_are_accepted(objects: Objects) -> None:
    """Every object of these kinds in docs/examples (what docs/getting-started.md applies) passes the rules; each
    file is an alternative, so each object is named after its file too."""
    applied = []
    for path in sorted((Path(__file__).resolve().parents[2] / "docs" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in KINDS:
                objects.create(doc["kind"], doc.get("spec") or {}, f"{path.stem}-{doc['metadata']['name']}")
                applied.append(f"{path.name}:{doc['kind']}")
    assert {a.split(":")[1] for a in applied} >= {"Broker", "Trigger", "KafkaChannel", "KafkaSink", "KafkaSource"}
