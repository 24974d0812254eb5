"""KafkaSink on the real kube-apiserver and real Kafka: the controller's lifecycle and every condition reason, and
the real receiver writing to the sink's topic — binary and structured, byte for byte — with the same answers as
channels and Brokers (202 only once Kafka holds the event, 400, 404, 413, 503 + Retry-After), on an address a
Broker of the same name never shares.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from kubernetes.client.rest import ApiException
from support.brokers import Brokers
from support.controller import Env, eventually
from support.receiver import Receiver, read_topic
from support.sinks import (
    SINK_HOST,
    Sinks,
)
from support.sinks import api as sinks_api

from kafka_eventing.core import brokers as kb
from kafka_eventing.localstack.kube import KubeControlPlane

#: The module's API server, with these kinds' CRDs (a fixture, used by name).
api = sinks_api

pytestmark = [pytest.mark.kube, pytest.mark.kafka]









def start(environment: Env, **settings: Any) -> None:
    environment.start_controller(environment.settings(**settings), brokers=True, sinks=True)


def make_topic(environment: Env, name: str, partitions: int = 1) -> None:
    for future in environment.admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=30)


def test_kafka_sink_lifecycle_and_every_condition_reason(sinks: Sinks) -> None:
    e = sinks.env
    start(e)
    suffix = uuid.uuid4().hex[:8]
    made, existing = f"made-{suffix}", f"existing-{suffix}"
    make_topic(e, existing, 2)
    sinks.create("made", topic=made, numPartitions=3, replicationFactor=1)
    sinks.create("existing", topic=existing, contentMode="structured")
    sinks.create("missing", topic=f"missing-{suffix}")
    sinks.create("half", topic=f"half-{suffix}", numPartitions=3)
    sinks.create("too-replicated", topic=f"rf-{suffix}", numPartitions=1, replicationFactor=3)
    sinks.create("no-secret", topic=existing, auth={"secret": {"ref": {"name": "nope"}}})
    sinks.create("bad-secret", topic=existing, auth={"secret": {"ref": {"name": "bad"}}})
    e.core.create_namespaced_secret(e.namespace, {"metadata": {"name": "bad"}, "stringData": {"protocol": "BOGUS"}})
    sinks.create("good-secret", topic=existing, auth={"secret": {"ref": {"name": "good"}}})
    e.core.create_namespaced_secret(e.namespace, {"metadata": {"name": "good"},
                                                  "stringData": e.kafka.connection_secret(sasl_ssl=True)})

    created = sinks.wait("made", "TopicReady", "True", "TopicCreated")
    assert "3 partitions" in created["message"]
    assert (e.topic(made) or (0,))[0] == 3
    assert "2 partitions" in sinks.wait("existing", "TopicReady", "True", "TopicExists")["message"]
    assert "create it" in sinks.wait("missing", "TopicReady", "False", "TopicNotFound")["message"]
    assert e.topic(f"missing-{suffix}") is None  # never made by a stray write or check
    half = sinks.wait("half", "TopicReady", "False", "TopicNotFound")
    assert "spec.numPartitions alone does not create it" in half["message"]
    sinks.wait("too-replicated", "TopicReady", "False", "InvalidReplicationFactor")
    assert f"Secret {e.namespace}/nope" in sinks.wait("no-secret", "ConfigParsed", "False", "SecretNotFound")["message"]
    assert "BOGUS" in sinks.wait("bad-secret", "ConfigParsed", "False", "InvalidSecret")["message"]
    sinks.wait("no-secret", "Ready", "False", "SecretNotFound")
    # A Secret for the SASL_SSL listener: its connection is on the status, for the receiver.
    sinks.wait("good-secret", "TopicReady", "True", "TopicExists")
    annotations = sinks.get("good-secret")["status"]["annotations"]
    assert annotations["kafka.eventing.knative.dev/auth.secret"] == f"{e.namespace}/good"
    assert annotations["kafka.eventing.knative.dev/bootstrap.servers"] == e.kafka.sasl_ssl_bootstrap_servers
    assert not (sinks.get("made")["status"].get("annotations") or {})  # the controller's own connection

    # Not Ready until the receiver is available; then the address on the sink ingress Service.
    assert sinks.wait("made", "DataPlaneAvailable", "False", "ReceiverUnavailable")
    assert not sinks.get("made")["status"].get("address")
    e.make_available("kafka-channel-receiver")
    sinks.wait("made", "Ready", "True")
    got = sinks.get("made")
    assert got["status"]["address"]["url"] == (
        f"http://kafka-sink-ingress.{e.system}.svc.cluster.local/{e.namespace}/made")
    assert got["status"]["observedGeneration"] == got["metadata"]["generation"]
    assert {c["type"] for c in got["status"]["conditions"]} == {
        "ConfigParsed", "TopicReady", "DataPlaneAvailable", "Addressable", "Ready"}
    assert sinks.condition("made", "TopicReady")["reason"] == "TopicCreated"  # kept on later reconciles

    # The CRD refuses what cannot be a KafkaSink.
    for bad in ({"topic": "t", "contentMode": "json"}, {"numPartitions": 1}, {"topic": "t", "numPartitions": 0}):
        with pytest.raises(ApiException) as info:
            sinks.create(f"bad-{uuid.uuid4().hex[:6]}", **bad)
        assert info.value.status == 422

    # Deleting a sink never deletes its topic: others read it.
    sinks.delete("made")
    eventually(lambda: _gone(sinks, "made"), what="sink deleted")
    assert (e.topic(made) or (0,))[0] == 3


def _gone(sinks: Sinks, name: str) -> bool:
    try:
        sinks.get(name)
    except ApiException as exc:
        return exc.status == 404
    return False


BINARY = {"ce-specversion": "1.0", "ce-type": "com.example.sink", "ce-source": "/sink/test",
          "ce-subject": "Grosse: 10 1/2; x=\"y\"", "ce-time": "2024-05-01T10:00:00Z", "ce-oddext": "a  b,\tc 'q' {}",
          "content-type": "application/json; charset=utf-8"}


def test_kafka_sink_data_plane(sinks: Sinks, brokers: Brokers,
                               start_receiver: Callable[..., Receiver],
                               kube_control_plane: KubeControlPlane) -> None:
    e = sinks.env
    start(e)
    suffix = uuid.uuid4().hex[:8]
    binary, structured = f"bin-{suffix}", f"struct-{suffix}"
    sinks.create("same", topic=binary, numPartitions=2, replicationFactor=1)
    sinks.create("structured", topic=structured, numPartitions=1, replicationFactor=1, contentMode="structured")
    sinks.create("missing", topic=f"missing-{suffix}")
    brokers.ready_broker("same")  # a Broker of the same namespace and name: another address, another topic
    for name in ("same", "structured"):
        sinks.wait(name, "Ready", "True")
    sinks.wait("missing", "TopicReady", "False", "TopicNotFound")
    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig),
        "KE_MAX_EVENT_BYTES": "4096", "KE_RETRY_AFTER_SECONDS": "3"})
    host = f"{SINK_HOST}.{e.system}.svc.cluster.local"

    def post(name: str, body: bytes, via: str = host, **headers: str) -> Any:
        return receiver.post(f"/{e.namespace}/{name}", body, {**BINARY, "ce-id": uuid.uuid4().hex, "Host": via,
                                                             **headers})

    body = '{"price": 1.50, "name": "Ünïcode"}'.encode()
    answer = post("same", body, **{"ce-id": "b-1"})
    assert answer.status_code == 202, answer.text
    (record,) = read_topic(e.kafka, binary, 1)
    assert record.value() == body
    headers = dict(record.headers())
    for name, value in BINARY.items():
        key = "content-type" if name == "content-type" else "ce_" + name[3:]
        assert headers[key] == value.encode(), key
    assert headers["ce_id"] == b"b-1"
    # Keyed by partitionkey only, as upstream's sink: the event has a subject and no partitionkey, so no key (a
    # compacted topic keeps it beside every other event of that subject). The Broker below keys by subject.
    assert record.key() is None

    assert post("structured", body, **{"ce-id": "s-1"}).status_code == 202
    (record,) = read_topic(e.kafka, structured, 1)
    assert dict(record.headers())["content-type"] == b"application/cloudevents+json"
    event = json.loads(record.value())
    for name, value in BINARY.items():
        if name.startswith("ce-"):
            assert event[name[3:]] == value, name  # every attribute's text as sent
    assert event["id"] == "s-1" and event["datacontenttype"] == BINARY["content-type"]
    assert event["data"] == json.loads(body)

    # The Broker of the same name is reached on the receiver's own address, and only there.
    assert post("same", b"{}", f"kafka-channel-receiver.{e.system}.svc.cluster.local",
                **{"ce-id": "to-broker"}).status_code == 202
    (to_broker,) = read_topic(e.kafka, kb.broker_topic(e.namespace, "same"), 1)
    assert dict(to_broker.headers())["ce_id"] == b"to-broker"
    assert to_broker.key() == BINARY["ce-subject"].encode()
    assert len(read_topic(e.kafka, binary, 2, timeout=3)) == 1

    missing = post("nope", b"{}")
    assert missing.status_code == 404 and f"KafkaSink {e.namespace}/nope" in missing.json()["error"]
    cold = post("missing", b"{}")
    assert cold.status_code == 503 and cold.headers["Retry-After"] == "3"
    assert "does not exist" in cold.json()["error"]
    assert post("same", b"{}", **{"ce-specversion": "0.1"}).status_code == 400
    assert post("same", b"x" * 5000).status_code == 413
    assert len(read_topic(e.kafka, binary, 2, timeout=3)) == 1  # nothing else was written
