"""What a KafkaNamespaced data plane is made of, as pure functions of the system receiver Deployment
(``controller/namespaced.py``); the reconcile itself runs on the real API server in
tests/integration/test_broker_controller.py."""

from __future__ import annotations

from typing import Any

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.namespaced import (
    LABEL_DATA_PLANE,
    NAMESPACED_RECEIVER,
    ingress_service,
    receiver_deployment,
    referenced,
)
from kafka_eventing.core import brokers as kb

SYSTEM_RECEIVER: dict[str, Any] = {"metadata": {"name": "kafka-eventing-receiver", "namespace": "knative-eventing"},
                                   "spec": {"replicas": 2, "template": {
    "metadata": {"labels": {"app.kubernetes.io/name": "kafka-eventing"}, "annotations": {"checksum/config": "abc"}},
    "spec": {"serviceAccountName": "kafka-eventing-receiver", "imagePullSecrets": [{"name": "registry"}],
             "containers": [{"name": "receiver", "image": "receiver:1",
                             "envFrom": [{"configMapRef": {"name": "kafka-eventing-config"}}],
                             "env": [{"name": "KE_CHANNEL_SOURCE", "value": "kube"},
                                     {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "t"}}}],
                             "ports": [{"name": "https", "containerPort": 8443}]}],
             "volumes": [{"name": "tmp", "emptyDir": {}},
                         {"name": "kafka-secret", "secret": {"secretName": "kafka-connection"}},
                         {"name": "tls", "projected": {"sources": [{"secret": {"name": "receiver-tls"}},
                                                                   {"configMap": {"name": "ca"}}]}}]}}}}
OWNERS = [{"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": "b", "uid": "u1"}]


def test_the_copies_are_every_configmap_and_secret_the_receiver_pods_read() -> None:
    assert referenced(SYSTEM_RECEIVER["spec"]["template"]) == (
        {"kafka-eventing-config", "ca"}, {"kafka-connection", "receiver-tls", "tok", "registry"})


def test_the_namespaced_receiver_is_the_system_one_scoped_to_its_namespace_on_its_own_account() -> None:
    dep = receiver_deployment(SYSTEM_RECEIVER, "team-a", OWNERS)
    pod = dep["spec"]["template"]
    assert dep["metadata"]["namespace"] == "team-a" and dep["metadata"]["ownerReferences"] == OWNERS
    assert dep["spec"]["replicas"] == 2
    assert pod["spec"]["serviceAccountName"] == NAMESPACED_RECEIVER
    assert pod["metadata"]["annotations"] == {"checksum/config": "abc"}  # a config change rolls it too
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items() and selector[LABEL_DATA_PLANE] == "namespaced"
    assert "kafka-eventing" not in selector.values()  # never the system receiver's pods
    env = pod["spec"]["containers"][0]["env"]
    assert {"name": "KE_RECEIVER_NAMESPACE", "value": "team-a"} in env
    assert SYSTEM_RECEIVER["spec"]["template"]["spec"]["serviceAccountName"] == "kafka-eventing-receiver"  # a copy
    # Another set of owners is another desired state (its hash), so the owners are rewritten.
    other = receiver_deployment(SYSTEM_RECEIVER, "team-a", [*OWNERS, {**OWNERS[0], "name": "c", "uid": "u2"}])
    assert not res.needs_update(dep, dep) and res.needs_update(dep, other)


def test_the_ingress_service_serves_the_receivers_port() -> None:
    svc = ingress_service(SYSTEM_RECEIVER, "team-a", OWNERS)
    assert svc["metadata"]["name"] == kb.NAMESPACED_INGRESS_SERVICE == "kafka-broker-ingress"
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == receiver_deployment(SYSTEM_RECEIVER, "team-a", OWNERS)["spec"]["selector"][
        "matchLabels"]


def test_a_namespaced_brokers_address_names_its_namespaces_ingress() -> None:
    from kafka_eventing.controller.brokers import broker_url
    from kafka_eventing.core.settings import Settings

    settings = Settings(system_namespace="knative-eventing", receiver_service="kafka-channel-receiver")
    assert broker_url(settings, "team-a", "b", namespaced=True) == \
        "http://kafka-broker-ingress.team-a.svc.cluster.local/team-a/b"
    assert broker_url(settings, "team-a", "b") == \
        "http://kafka-channel-receiver.knative-eventing.svc.cluster.local/team-a/b"
