"""sinks: a KafkaSink's conditions and reasons, its topic created only when both sizes are given and never altered,
its connection on the status for the receiver (fakes for Kafka and the API server)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller.reconciler import Reconciler, Stores
from kafka_eventing.controller.sinks import SinkReconciler
from kafka_eventing.controller.topics import TopicError, TopicState
from kafka_eventing.core.kafka_config import STATUS_BOOTSTRAP, STATUS_CHECKSUM, STATUS_SECRET, connection_ref

from .fakes import SETTINGS, DictStore, FakeAdmin, StatusPatches

RECEIVER = {"metadata": {"namespace": "knative-eventing", "name": SETTINGS.receiver_deployment_name},
            "spec": {"replicas": 1}, "status": {"availableReplicas": 1, "replicas": 1, "updatedReplicas": 1,
                                                 "conditions": [{"type": "Available", "status": "True"}]}}


class Secrets:
    def __init__(self, secrets: dict[str, dict[str, str]] | None = None, status: int | None = None) -> None:
        self.secrets, self.status = secrets or {}, status

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        if self.status is not None:
            raise ApiException(status=self.status)
        if name not in self.secrets:
            raise ApiException(status=404)
        data = {k: base64.b64encode(v.encode()).decode() for k, v in self.secrets[name].items()}
        return client.V1Secret(data=data)


def sink(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "shop", "name": "s", "generation": 2}, "spec": spec, "status": status or {}}


def reconcile(obj: dict[str, Any], admin: FakeAdmin, secrets: Secrets | None = None,
              receiver: bool = True) -> dict[str, Any]:
    stores = Stores(deployments=DictStore(RECEIVER) if receiver else DictStore(), services=DictStore(),
                    config_maps=DictStore(), secrets=DictStore())
    base = Reconciler(client.ApiClient(), SETTINGS, stores)
    patches = StatusPatches()
    base.custom = patches  # type: ignore[assignment]
    base.core = secrets or Secrets()  # type: ignore[assignment]
    reconciler = SinkReconciler(base, DictStore(obj))
    reconciler._admin = lambda _connection: admin  # type: ignore[method-assign]
    reconciler.reconcile_sink("shop", "s")
    (body,) = patches.calls
    return dict(body["status"])


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c.get("reason", ""), c.get("message", "")) for c in status["conditions"]}


def test_created_when_both_sizes_are_given_and_ready_on_the_sink_ingress_address() -> None:
    admin = FakeAdmin()
    status = reconcile(sink(topic="t", numPartitions=3, replicationFactor=2), admin)
    got = conditions(status)
    assert got["TopicReady"][:2] == ("True", "TopicCreated") and "3 partitions" in got["TopicReady"][2]
    assert admin.topics["t"] == TopicState("t", 3, None)  # the cluster's default retention
    assert got["Ready"][0] == "True" and got["Addressable"][0] == "True"
    assert status["address"] == {"url": "http://kafka-sink-ingress.knative-eventing.svc.cluster.local/shop/s"}
    assert status["observedGeneration"] == 2 and "annotations" not in status  # the controller's own cluster
    # Later reconciles keep saying it was created; an existing topic is never altered.
    stored = sink({"conditions": status["conditions"]}, topic="t", numPartitions=6, replicationFactor=2)
    assert conditions(reconcile(stored, admin))["TopicReady"][1] == "TopicCreated"
    assert admin.calls == ["create"] and admin.topics["t"].partitions == 3


@pytest.mark.parametrize(("spec", "hint"), [({}, ""), ({"numPartitions": 3}, "spec.numPartitions alone"),
                                            ({"replicationFactor": 1}, "spec.replicationFactor alone")])
def test_otherwise_the_topic_must_exist(spec: dict[str, Any], hint: str) -> None:
    status = reconcile(sink(topic="t", **spec), FakeAdmin())
    ready, reason, message = conditions(status)["TopicReady"]
    assert (ready, reason) == ("False", "TopicNotFound") and hint in message and "create it" in message
    assert conditions(status)["Ready"][:2] == ("False", "TopicNotFound") and status["address"] is None
    exists = conditions(reconcile(sink(topic="t", **spec), FakeAdmin({"t": TopicState("t", 4, 1000)})))
    assert exists["TopicReady"][:2] == ("True", "TopicExists") and "4 partitions" in exists["TopicReady"][2]


def test_kafka_refusals_and_the_receiver_are_reasons() -> None:
    refused = FakeAdmin(fail=TopicError("KafkaUnreachable", "Kafka at x:1 is unreachable"))
    assert conditions(reconcile(sink(topic="t"), refused))["TopicReady"][:2] == ("False", "KafkaUnreachable")
    got = conditions(reconcile(sink(topic="t"), FakeAdmin({"t": TopicState("t", 1, None)}), receiver=False))
    assert got["DataPlaneAvailable"][:2] == ("False", "ReceiverUnavailable")
    assert got["Ready"][:2] == ("False", "ReceiverUnavailable")


@pytest.mark.parametrize(("secrets", "reason", "words"), [
    (Secrets(), "SecretNotFound", "Secret shop/auth named by spec.auth.secret.ref.name does not exist"),
    (Secrets(status=403), "SecretNotReadable", "receiver.rbac.secretNamespaces"),
    (Secrets({"auth": {"protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}}), "InvalidSecret", "Secret shop/auth"),
])
def test_secret_problems_are_config_reasons(secrets: Secrets, reason: str, words: str) -> None:
    status = reconcile(sink(topic="t", auth={"secret": {"ref": {"name": "auth"}}}), FakeAdmin(), secrets)
    ready, got, message = conditions(status)["ConfigParsed"]
    assert (ready, got) == ("False", reason) and words in message
    assert conditions(status)["TopicReady"][:2] == ("Unknown", "ConfigNotParsed")


def test_its_own_cluster_and_secret_go_on_the_status_for_the_receiver() -> None:
    secrets = Secrets({"auth": {"protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "user": "u",
                                "password": "p1"}})
    admin = FakeAdmin({"t": TopicState("t", 1, None)})
    spec = {"topic": "t", "bootstrapServers": ["far:9092", "far2:9092"], "auth": {"secret": {"ref": {"name": "auth"}}}}
    status = reconcile(sink(**spec), admin, secrets)
    ref = connection_ref(status)
    assert ref is not None and ref.bootstrap_servers == "far:9092,far2:9092" and ref.secret == "shop/auth"
    assert status["annotations"][STATUS_SECRET] == "shop/auth" and "p1" not in str(status)
    # A rotated Secret: another checksum, so the receiver makes a new producer.
    secrets.secrets["auth"]["password"] = "p2"
    rotated = reconcile(sink({"annotations": status["annotations"]}, **spec), admin, secrets)
    assert rotated["annotations"][STATUS_CHECKSUM] != status["annotations"][STATUS_CHECKSUM]
    # Back on the controller's own cluster: the annotations are removed (merge-patch nulls).
    back = reconcile(sink({"annotations": status["annotations"]}, topic="t"), admin)
    assert back["annotations"] == {STATUS_BOOTSTRAP: None, STATUS_SECRET: None, STATUS_CHECKSUM: None}
