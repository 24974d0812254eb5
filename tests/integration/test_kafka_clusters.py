"""The receiver writes to the Kafka cluster each target names: two real Kafka clusters on loopback, the real
controller on the real kube-apiserver, the real receiver (gunicorn, targets from the API server).

A Broker whose config names the second cluster gets its topic there, and its events go there and only there; a
rotated connection Secret reaches the receiver's producer; past the receiver's bound of connections a target on
another cluster gets a 503 with Retry-After, never a write to the wrong cluster.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient
from support.brokers import Brokers
from support.controller import Env, eventually
from support.receiver import Receiver, read_topic
from support.sinks import (
    SINK_HOST,
    Sinks,
)
from support.sinks import api as sinks_api

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.kafka_config import STATUS_BOOTSTRAP, STATUS_CHECKSUM, STATUS_SECRET
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane

#: The module's API server, with these kinds' CRDs (a fixture, used by name).
api = sinks_api

pytestmark = [pytest.mark.kube, pytest.mark.kafka]


@pytest.fixture(scope="module")
def second_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    """A second, independent Kafka cluster on loopback (its own ports, data and certificates)."""
    workdir = tmp_path_factory.mktemp("kafka2")
    node = KafkaNode(workdir)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def start(environment: Env) -> None:
    environment.start_controller(environment.settings(), brokers=True, sinks=True)


def topics(kafka: KafkaNode) -> set[str]:
    admin = AdminClient({**kafka.client_config(), "log_level": 2})
    return set(admin.list_topics(timeout=10).topics)


def event(event_id: str) -> dict[str, str]:
    return {"ce-specversion": "1.0", "ce-id": event_id, "ce-type": "com.example.t", "ce-source": "/test",
            "content-type": "application/json"}


def config_map(b: Brokers, name: str, data: dict[str, str]) -> dict[str, Any]:
    """A Broker config ConfigMap in the system namespace; the Broker's spec.config referencing it."""
    e = b.env
    e.core.create_namespaced_config_map(e.system, {"metadata": {"name": name}, "data": data})
    return {"config": {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "namespace": e.system}}


def kube_receiver(start_receiver: Callable[..., Receiver], b: Brokers, kube: KubeControlPlane,
                  **variables: str) -> Receiver:
    return start_receiver("", bootstrap=b.env.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube.kubeconfig), **variables})


def test_a_broker_on_a_second_cluster_gets_its_events_there_and_only_there(
        brokers: Brokers, second_kafka: KafkaNode, start_receiver: Callable[..., Receiver],
        kube_control_plane: KubeControlPlane) -> None:
    e = brokers.env
    start(e)
    far_config = config_map(brokers, "far-config", {"bootstrap.servers": second_kafka.bootstrap_servers,
                                                    kb.KEY_PARTITIONS: "2"})
    brokers.ready_broker("far", far_config)
    brokers.ready_broker("near")
    far_topic, near_topic = kb.broker_topic(e.namespace, "far"), kb.broker_topic(e.namespace, "near")
    # The controller made each topic on its Broker's cluster only, and told the receiver where "far" writes.
    assert far_topic in topics(second_kafka) and far_topic not in topics(e.kafka)
    assert near_topic in topics(e.kafka) and near_topic not in topics(second_kafka)
    annotations = brokers.get(kb.BROKERS, "far")["status"]["annotations"]
    assert annotations[STATUS_BOOTSTRAP] == second_kafka.bootstrap_servers and annotations[STATUS_CHECKSUM]
    assert STATUS_SECRET not in annotations
    assert STATUS_BOOTSTRAP not in (brokers.get(kb.BROKERS, "near")["status"].get("annotations") or {})

    receiver = kube_receiver(start_receiver, brokers, kube_control_plane)
    sent = {"far": [f"far-{i}" for i in range(6)], "near": [f"near-{i}" for i in range(6)]}
    for name, ids in sent.items():
        for event_id in ids:  # both workers take some: each makes its own producer for "far"
            answer = receiver.post(f"/{e.namespace}/{name}", b'{"n":1}', event(event_id))
            assert answer.status_code == 202, answer.text
    got_far = read_topic(second_kafka, far_topic, 6)
    assert sorted(dict(m.headers())["ce_id"].decode() for m in got_far) == sorted(sent["far"])
    got_near = read_topic(e.kafka, near_topic, 6)
    assert sorted(dict(m.headers())["ce_id"].decode() for m in got_near) == sorted(sent["near"])
    # Nothing stranded on the wrong cluster: no topic there was created by a stray write either.
    assert far_topic not in topics(e.kafka) and near_topic not in topics(second_kafka)

    # No target names the second cluster any more: its producers are closed.
    brokers.delete(kb.BROKERS, "far")
    eventually(lambda: "kafka connection closed" in receiver.log.read_text(), what="connection closed")


def test_a_rotated_secret_reaches_the_producer(
        brokers: Brokers, second_kafka: KafkaNode, start_receiver: Callable[..., Receiver],
        kube_control_plane: KubeControlPlane) -> None:
    e = brokers.env
    start(e)
    # Plain text first; then the Secret is rotated to the SASL_SSL listener with SCRAM credentials (another
    # port, protocol and credentials on the same cluster): only a producer made from the new data can use it.
    e.core.create_namespaced_secret(e.system, {"metadata": {"name": "far-auth"},
                                               "stringData": second_kafka.connection_secret()})
    spec = config_map(brokers, "far-config", {"auth.secret.ref.name": "far-auth"})
    brokers.ready_broker("far", spec)
    first = brokers.get(kb.BROKERS, "far")["status"]["annotations"]
    assert first[STATUS_SECRET] == f"{e.system}/far-auth"
    assert first[STATUS_BOOTSTRAP] == second_kafka.bootstrap_servers
    receiver = kube_receiver(start_receiver, brokers, kube_control_plane, KE_RETRY_AFTER_SECONDS="1")
    topic = kb.broker_topic(e.namespace, "far")
    for i in range(4):
        assert receiver.post(f"/{e.namespace}/far", b"{}", event(f"before-{i}")).status_code == 202

    rotation = {"metadata": {"name": "far-auth"}, "stringData": second_kafka.connection_secret(sasl_ssl=True)}
    e.core.replace_namespaced_secret("far-auth", e.system, rotation)
    rotated = eventually(lambda: (a := brokers.get(kb.BROKERS, "far")["status"]["annotations"])[STATUS_CHECKSUM]
                         != first[STATUS_CHECKSUM] and a, what="the rotated Secret's checksum in the status")
    assert rotated[STATUS_BOOTSTRAP] == second_kafka.sasl_ssl_bootstrap_servers
    for i in range(4):
        answer = receiver.post(f"/{e.namespace}/far", b"{}", event(f"after-{i}"))
        assert answer.status_code == 202, answer.text
    log = receiver.log.read_text()
    # The new producers connect to the SASL_SSL listener; the old ones are closed.
    assert second_kafka.sasl_ssl_bootstrap_servers in log and "kafka connection closed" in log
    ids = {dict(m.headers())["ce_id"].decode() for m in read_topic(second_kafka, topic, 8)}
    assert ids == {f"before-{i}" for i in range(4)} | {f"after-{i}" for i in range(4)}
    assert topic not in topics(e.kafka)


def test_past_the_bound_of_connections_a_target_gets_503(
        brokers: Brokers, second_kafka: KafkaNode, start_receiver: Callable[..., Receiver],
        kube_control_plane: KubeControlPlane) -> None:
    e = brokers.env
    start(e)
    brokers.ready_broker("far", config_map(brokers, "far-config", {"bootstrap.servers":
                                                                    second_kafka.bootstrap_servers}))
    brokers.ready_broker("near")
    # No connection beyond the receiver's own: the Broker on the second cluster is refused, not misrouted.
    receiver = kube_receiver(start_receiver, brokers, kube_control_plane, KE_MAX_KAFKA_CONNECTIONS="0",
                             KE_RETRY_AFTER_SECONDS="7")
    answer = receiver.post(f"/{e.namespace}/far", b"{}", event(uuid.uuid4().hex))
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "7"
    assert "KE_MAX_KAFKA_CONNECTIONS" in answer.json()["error"]
    assert receiver.post(f"/{e.namespace}/near", b"{}", event("n")).status_code == 202
    assert kb.broker_topic(e.namespace, "far") not in topics(e.kafka)
    assert not read_topic(second_kafka, kb.broker_topic(e.namespace, "far"), 1, timeout=3)
    assert httpx.get(receiver.url + "/readyz", timeout=5).status_code == 200


def test_a_kafka_sink_on_a_second_cluster_gets_its_events_there_and_503_when_it_is_down(
        sinks: Sinks, brokers: Brokers, second_kafka: KafkaNode,
        start_receiver: Callable[..., Receiver], kube_control_plane: KubeControlPlane) -> None:
    e = sinks.env
    start(e)
    far = f"far-{uuid.uuid4().hex[:8]}"
    sinks.create("far", topic=far, numPartitions=1, replicationFactor=1,
                 bootstrapServers=[second_kafka.bootstrap_servers])
    e.make_available("kafka-channel-receiver")
    sinks.wait("far", "Ready", "True")
    assert far in topics(second_kafka) and far not in topics(e.kafka)
    receiver = kube_receiver(start_receiver, brokers, kube_control_plane, KE_RETRY_AFTER_SECONDS="4")
    host = f"{SINK_HOST}.{e.system}.svc.cluster.local"
    for i in range(4):
        answer = receiver.post(f"/{e.namespace}/far", b"{}", {**event(f"s-{i}"), "Host": host})
        assert answer.status_code == 202, answer.text
    assert {dict(m.headers())["ce_id"].decode() for m in read_topic(second_kafka, far, 4)} == {
        f"s-{i}" for i in range(4)}
    assert far not in topics(e.kafka)

    # The sink's cluster goes down: 503 with Retry-After, never 202 (and nothing written elsewhere).
    second_kafka.stop()
    try:
        answer = receiver.post(f"/{e.namespace}/far", b"{}", {**event("down"), "Host": host})
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "4"
        assert far not in topics(e.kafka)
    finally:
        second_kafka.start()
