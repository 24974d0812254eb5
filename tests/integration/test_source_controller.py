"""KafkaSources reconciled by the controller on a real kube-apiserver (+ controller-manager) and real Kafka, with
the source's dispatcher run in-process against the same API server (as its pod would, the tests playing the
kubelet as the channel tests do).

Lifecycle, every field, every condition reason; initial offsets committed before Ready (a new group never
replays from the beginning); the scale subresource and the partition cap; a source on the SASL_SSL listener
through ``net.sasl`` Secrets; deletion removing the Deployment, its Secret and the consumer group while the sink
hangs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry
from support.controller import Env, eventually, settle
from support.dispatcher import Subscriber

from fixtures.kube import gone
from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.crd import SOURCE_CRD, install_crd
from kafka_eventing.controller.kafkasources import (
    ANNOTATION_SOURCE,
    SOURCE_FINALIZER,
    selector,
    source_dispatcher_name,
)
from kafka_eventing.controller.main import api_client
from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.dispatcher.sources import KubeSourceSource
from kafka_eventing.localstack._proc import free_port, terminate
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane
from waiting import seconds_until, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.kafka]

MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def api(kube_control_plane: KubeControlPlane) -> Iterator[client.ApiClient]:
    c = api_client(kube_control_plane.kubeconfig)
    install_crd(c)
    install_crd(c, file=SOURCE_CRD)
    yield c
    c.close()


class Sources:
    def __init__(self, environment: Env, kafka: KafkaNode) -> None:
        self.env, self.ns, self.custom, self.kafka = environment, environment.namespace, environment.custom, kafka
        self.admin = AdminClient(kafka.client_config())
        self.dispatchers: list[tuple[Any, threading.Thread]] = []

    def create(self, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None,
               version: str = ks.VERSION, annotations: dict[str, str] | None = None) -> None:
        body = {"apiVersion": f"{ks.GROUP}/{version}", "kind": ks.KIND,
                "metadata": {"name": name, "namespace": self.ns, "labels": labels or {},
                             "annotations": annotations or {}}, "spec": spec}
        self.custom.create_namespaced_custom_object(ks.GROUP, version, self.ns, ks.PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(ks.GROUP, ks.VERSION, self.ns, ks.PLURAL, name))

    def patch(self, name: str, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(ks.GROUP, ks.VERSION, self.ns, ks.PLURAL, name, body,
                                                   _content_type=MERGE)

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(ks.GROUP, ks.VERSION, self.ns, ks.PLURAL, name)

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        for c in (self.get(name).get("status") or {}).get("conditions") or ():
            if c["type"] == kind:
                return dict(c)
        return None

    def wait(self, name: str, kind: str, status: str, reason: str | None = None,
             timeout: float = 40) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            c = self.condition(name, kind)
            ok = c is not None and c["status"] == status and (reason is None or c.get("reason") == reason)
            return c if ok else None

        return eventually(check, timeout, f"{name} {kind}={status} {reason or ''}")

    def topic(self, partitions: int) -> str:
        name = f"ks.{uuid.uuid4().hex[:10]}"
        for fut in self.admin.create_topics([NewTopic(name, num_partitions=partitions,
                                                      replication_factor=1)]).values():
            fut.result(timeout=30)
        return name

    def produce(self, topic: str, values: list[bytes], partition: int = 0, *, sasl: bool = False) -> None:
        producer = Producer(self.kafka.client_config(sasl_ssl=sasl))
        for value in values:
            producer.produce(topic, value=value, partition=partition)
        assert producer.flush(30) == 0

    def committed(self, group: str, topic: str, partitions: int) -> list[int]:
        consumer = Consumer({**self.kafka.client_config(), "group.id": group, "enable.auto.commit": False})
        try:
            return [tp.offset for tp in consumer.committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout=10)]
        finally:
            consumer.close()

    def group_exists(self, group: str) -> bool:
        listed = self.admin.list_consumer_groups(request_timeout=10).result(timeout=15)
        return group in {g.group_id for g in listed.valid}

    def deployment(self, name: str) -> Any:
        return self.env.apps.read_namespaced_deployment(source_dispatcher_name(self.ns, name), self.env.system)

    def ready(self, name: str) -> dict[str, Any]:
        dispatcher = source_dispatcher_name(self.ns, name)
        eventually(lambda: self.env.apps.read_namespaced_deployment(dispatcher, self.env.system),
                   what="source dispatcher Deployment")
        self.env.make_available(dispatcher)
        self.wait(name, "Ready", "True")
        return self.get(name)

    def mount(self, name: str, tmp_path: Path) -> tuple[Path | None, str]:
        """What the kubelet makes of the Deployment's projected connection volume (Secret keys of the system
        namespace, the protocol from a pod annotation), and the bootstrap servers from its env."""
        dep = self.deployment(name)
        pod = dep.spec.template
        variables = {e.name: e.value for e in pod.spec.containers[0].env}
        volume = next((v for v in pod.spec.volumes if v.name == "kafka-secret"), None)
        if volume is None:
            return None, variables["KE_BOOTSTRAP_SERVERS"]
        mount = tmp_path / f"secret-{name}"
        mount.mkdir()
        for source in volume.projected.sources:
            if source.secret is not None:
                data = self.env.core.read_namespaced_secret(source.secret.name, self.env.system).data
                for item in source.secret.items:
                    (mount / item.path).write_bytes(base64.b64decode(data[item.key]))
            else:
                for item in source.downward_api.items:
                    key = item.field_ref.field_path.split("'")[1]
                    (mount / item.path).write_text(pod.metadata.annotations[key])
        assert variables["KE_KAFKA_SECRET_DIR"] == "/etc/kafka-secret"
        return mount, variables["KE_BOOTSTRAP_SERVERS"]

    def run_dispatcher(self, name: str, tmp_path: Path) -> Any:
        """The source's dispatcher as its pod runs it: its connection mounted, the source watched on the API."""
        mount, servers = self.mount(name, tmp_path)
        settings = Settings(source_namespace=self.ns, source_name=name, kafka_secret_dir=mount, log_level="WARNING",
                            bootstrap_servers=servers,
                            kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")
        source = KubeSourceSource(self.env.api, self.ns, name, watch_timeout_seconds=30)
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                       registry=CollectorRegistry(), host="127.0.0.1", port=0,
                                       shutdown_grace=1.0)
        thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
        thread.start()
        self.dispatchers.append((dispatcher, thread))
        wait_for(lambda: dispatcher.readiness()[0], 40, f"dispatcher of {name} joined")
        return dispatcher

    def stop_dispatchers(self) -> None:
        for dispatcher, thread in self.dispatchers:
            dispatcher.stop()
            thread.join(30)
        self.dispatchers.clear()


def _sources(environment: Env, kafka: KafkaNode, **options: Any) -> Iterator[Sources]:
    s = Sources(environment, kafka)
    environment.start_controller(environment.settings(), sources=True, brokers=False, **options)
    try:
        yield s
    finally:
        s.stop_dispatchers()
        for ctl in environment.controllers:
            ctl.stop()
        environment.controllers.clear()
        for item in environment.custom.list_namespaced_custom_object(ks.GROUP, ks.VERSION, s.ns, ks.PLURAL)["items"]:
            with contextlib.suppress(ApiException):
                s.patch(item["metadata"]["name"], {"metadata": {"finalizers": []}})


@pytest.fixture
def sources(env: Env, kafka_running: KafkaNode) -> Iterator[Sources]:
    yield from _sources(env, kafka_running)


@pytest.fixture
def keda_sources(env: Env, kafka_running: KafkaNode, keda_crds: Any) -> Iterator[Sources]:
    """KEDA's real CRDs, absent at the start (the test installs them): discovery re-asked every half second."""
    yield from _sources(env, kafka_running, keda_discovery_seconds=0.5)


@pytest.fixture
def slow_sources(env: Env, kafka_running: KafkaNode) -> Iterator[Sources]:
    """The controller with production's recheck and resync (two and five minutes): only a watch, or the short retry
    of a missing topic, reconciles a source in seconds."""
    yield from _sources(env, kafka_running, topic_recheck_seconds=120, resync_seconds=300)


def sink_service(s: Sources, name: str = "sink") -> None:
    s.env.core.create_namespaced_service(s.ns, {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})


def test_lifecycle_every_field_scale_and_no_replay(sources: Sources, http: Subscriber,
                                                   tmp_path: Path) -> None:
    s = sources
    sink_service(s)
    t1, t2 = s.topic(3), s.topic(2)
    s.produce(t1, [b"old-1", b"old-2"])  # before the source: never delivered (initialOffset latest)
    spec = {"bootstrapServers": [s.kafka.bootstrap_servers], "topics": [t1, t2], "consumerGroup": "grp-" + t1,
            "initialOffset": "latest", "consumers": 5, "ordering": "unordered",
            "ceOverrides": {"extensions": {"team": "pay"}},
            "delivery": {"retry": 1, "backoffDelay": "PT0.01S", "deadLetterSink": {"uri": http.url("/dls")}},
            "sink": {"ref": {"apiVersion": "v1", "kind": "Service", "name": "sink"}, "uri": "/events"}}
    s.create("life", spec, {ks.LABEL_KEY_TYPE: "string"})
    obj = s.ready("life")
    status = obj["status"]
    assert status["sinkUri"] == f"http://sink.{s.ns}.svc.cluster.local/events"
    assert status["deadLetterSinkUri"] == http.url("/dls")
    dispatcher = source_dispatcher_name(s.ns, "life")
    assert status["selector"] == selector(dispatcher)
    assert status["consumers"] == 3  # 5 asked, the largest topic has 3 partitions
    for kind in ks.DEPENDENTS:
        assert s.condition("life", kind)["status"] == "True", kind
    assert SOURCE_FINALIZER in obj["metadata"]["finalizers"]
    # Committed before Ready: latest = the end of each partition, so a restart never replays from the beginning.
    assert s.committed("grp-" + t1, t1, 3) == [2, 0, 0]
    assert s.committed("grp-" + t1, t2, 2) == [0, 0]
    dep = s.deployment("life")
    assert dep.spec.replicas == 3
    dep_env = {e.name: e.value for e in dep.spec.template.spec.containers[0].env}
    assert (dep_env["KE_SOURCE_NAMESPACE"], dep_env["KE_SOURCE_NAME"]) == (s.ns, "life")
    assert dep_env["KE_DISPATCHER_INITIAL_OFFSET"] == "latest"
    assert dep_env["KE_BOOTSTRAP_SERVERS"] == s.kafka.bootstrap_servers
    assert dep.spec.template.metadata.annotations[ANNOTATION_SOURCE] == f"{s.ns}/life"
    pods = s.env.core.list_namespaced_pod(s.env.system, label_selector=status["selector"]).items
    assert pods, "status.selector selects the dispatcher pods"

    # v1beta1 serves the same object.
    beta = s.custom.get_namespaced_custom_object(ks.GROUP, "v1beta1", s.ns, ks.PLURAL, "life")
    assert beta["spec"]["topics"] == [t1, t2]

    # The scale subresource: kubectl scale / KEDA set spec.consumers.
    s.custom.patch_namespaced_custom_object_scale(ks.GROUP, ks.VERSION, s.ns, ks.PLURAL, "life",
                                                  {"spec": {"replicas": 1}}, _content_type=MERGE)
    eventually(lambda: s.deployment("life").spec.replicas == 1, what="scaled down to 1")
    scale = s.custom.get_namespaced_custom_object_scale(ks.GROUP, ks.VERSION, s.ns, ks.PLURAL, "life")
    assert scale["spec"]["replicas"] == 1 and scale["status"]["selector"] == status["selector"]
    s.custom.patch_namespaced_custom_object_scale(ks.GROUP, ks.VERSION, s.ns, ks.PLURAL, "life",
                                                  {"spec": {"replicas": 2}}, _content_type=MERGE)
    eventually(lambda: s.deployment("life").spec.replicas == 2, what="scaled up to 2")
    s.patch("life", {"spec": {"consumers": 0}})
    s.wait("life", ks.DEPLOYED, "True", "ScaledToZero")
    assert s.deployment("life").spec.replicas == 0
    eventually(lambda: s.get("life")["status"]["consumers"] == 0, what="status.consumers 0")

    # The sink in-process: the source's own URI for the dispatcher run here (the Service's DNS name is not).
    s.patch("life", {"spec": {"consumers": 1, "sink": {"ref": None, "uri": http.url("/events")}}})
    eventually(lambda: s.get("life")["status"].get("sinkUri") == http.url("/events"), what="sinkUri updated")
    s.run_dispatcher("life", tmp_path)
    s.produce(t1, [b"new-1"], partition=1)
    s.produce(t2, [b"new-2"], partition=0)
    wait_for(lambda: len(http.at("/events")) >= 2, 30, "two events")
    time.sleep(1)
    got = {r.body: r for r in http.at("/events")}
    assert set(got) == {b"new-1", b"new-2"}  # nothing from before the source
    assert got[b"new-1"].headers["ce-source"] == f"/apis/v1/namespaces/{s.ns}/kafkasources/life#{t1}"
    assert got[b"new-1"].headers["ce-id"] == "partition:1/offset:0"
    assert got[b"new-2"].headers["ce-team"] == "pay"


def test_initial_offset_earliest_is_committed_at_the_start(sources: Sources) -> None:
    s = sources
    topic = s.topic(2)
    s.produce(topic, [b"a", b"b", b"c"], partition=1)
    s.create("early", {"bootstrapServers": [s.kafka.bootstrap_servers], "topics": [topic],
                       "initialOffset": "earliest", "sink": {"uri": "http://127.0.0.1:9/x"}})
    s.wait("early", ks.INITIAL_OFFSETS_COMMITTED, "True")
    uid = s.get("early")["metadata"]["uid"]
    assert s.committed(f"knative-kafka-source-{uid}", topic, 2) == [0, 0]
    # Committed once: later reconciles do not move it (the running group owns its offsets).
    s.produce(topic, [b"d"], partition=0)
    time.sleep(2.5)
    assert s.committed(f"knative-kafka-source-{uid}", topic, 2) == [0, 0]


def test_a_source_is_ready_within_seconds_of_its_topic_or_sink_appearing(slow_sources: Sources) -> None:
    """A KafkaSource whose topic is created after it is Ready within 5 s of the topic's creation (a missing topic is
    looked for again after 1, 2, then every 3 s); one whose sink Service is created after it, within 5 s of the
    Service's (watched by name). The test plays the kubelet for the dispatcher's pods as it polls."""
    s = slow_sources
    (ctl,) = s.env.controllers
    servers = [s.kafka.bootstrap_servers]
    missing = f"ks.late.{uuid.uuid4().hex[:6]}"
    s.create("late-topic", {"bootstrapServers": servers, "topics": [missing], "sink": {"uri": "http://127.0.0.1:9/"}})
    s.create("late-sink", {"bootstrapServers": servers, "topics": [s.topic(1)],
                           "sink": {"ref": {"apiVersion": "v1", "kind": "Service", "name": "late-sink"}}})
    s.wait("late-topic", ks.CONNECTION_ESTABLISHED, "False", "TopicNotFound")
    s.wait("late-sink", ks.SINK_PROVIDED, "False", "DestinationNotFound")
    settle(ctl)  # the echoes of the controller's own writes are done (the retries of the topic are seconds apart)

    def ready(name: str) -> bool:
        dispatcher = source_dispatcher_name(s.ns, name)
        with contextlib.suppress(ApiException):
            s.env.mark_pods_ready(dispatcher)
        return (s.condition(name, "Ready") or {}).get("status") == "True"

    took = {}
    for fut in s.admin.create_topics([NewTopic(missing, num_partitions=1, replication_factor=1)]).values():
        fut.result(timeout=30)
    took["topic"] = seconds_until(lambda: ready("late-topic"), 30, "late-topic Ready", interval=0.1,
                                  tolerate=(ApiException,))
    sink_service(s, "late-sink")
    took["sink"] = seconds_until(lambda: ready("late-sink"), 30, "late-sink Ready", interval=0.1,
                                 tolerate=(ApiException,))
    print(f"Ready after the dependency's creation: {took}")
    assert took["topic"] < 5, f"topic noticed after {took['topic']:.1f}s"
    assert took["sink"] < 5, f"sink Service noticed after {took['sink']:.1f}s"


def test_condition_reasons_and_recovery(sources: Sources) -> None:
    s = sources
    servers = [s.kafka.bootstrap_servers]
    sink = {"uri": "http://127.0.0.1:9/x"}
    missing = f"ks.missing.{uuid.uuid4().hex[:6]}"
    s.create("notopic", {"bootstrapServers": servers, "topics": [missing], "sink": sink})
    c = s.wait("notopic", ks.CONNECTION_ESTABLISHED, "False", "TopicNotFound")
    assert missing in c["message"]
    assert s.condition("notopic", "Ready")["reason"] == "TopicNotFound"
    for fut in s.admin.create_topics([NewTopic(missing, num_partitions=1, replication_factor=1)]).values():
        fut.result(timeout=30)
    s.wait("notopic", ks.CONNECTION_ESTABLISHED, "True")

    topic = s.topic(1)
    s.create("nosink", {"bootstrapServers": servers, "topics": [topic],
                        "sink": {"ref": {"apiVersion": "v1", "kind": "Service", "name": "absent"}}})
    c = s.wait("nosink", ks.SINK_PROVIDED, "False", "DestinationNotFound")
    assert "absent" in c["message"]
    sink_service(s, "absent")
    s.wait("nosink", ks.SINK_PROVIDED, "True")

    # What the CRD refuses at apply never reaches the controller (tests/integration/test_crd_validation.py has a
    # case per rule); the controller's own reasons for these stay for objects stored before the rules.
    for field, bad in (("ordering", {"ordering": "sorted"}), ("initialOffset", {"initialOffset": "middle"}),
                       ("delivery.backoffPolicy", {"delivery": {"backoffPolicy": "random"}})):
        with pytest.raises(ApiException) as refused:
            s.create("refused", {"bootstrapServers": servers, "topics": [topic], "sink": sink, **bad})
        assert refused.value.status == 422 and f"spec.{field}: Unsupported value" in refused.value.body

    s.create("badext", {"bootstrapServers": servers, "topics": [topic], "sink": sink,
                        "ceOverrides": {"extensions": {"Not-Valid": "x"}}})
    s.wait("badext", ks.DEPLOYED, "False", "InvalidCeOverrides")
    assert s.condition("badext", "Ready")["reason"] == "InvalidCeOverrides"
    s.patch("badext", {"spec": {"ceOverrides": {"extensions": {"Not-Valid": None, "valid": "x"}}}})
    s.wait("badext", ks.DEPLOYED, "False", "DeploymentUnavailable")

    for name, spec, labels, kind, reason in [
        ("badkey", {}, {ks.LABEL_KEY_TYPE: "uuid"}, ks.KEY_TYPE_CORRECT, "InvalidKeyType"),
        ("nosecret", {"net": {"sasl": {"enable": True, "user": {"secretKeyRef": {"name": "gone", "key": "u"}},
                                       "password": {"secretKeyRef": {"name": "gone", "key": "p"}}}}},
         None, ks.CONNECTION_ESTABLISHED, "SecretNotFound"),
        ("nokey", {"net": {"sasl": {"enable": True, "user": {"secretKeyRef": {"name": "creds", "key": "user"}},
                                    "password": {"secretKeyRef": {"name": "creds", "key": "nope"}}}}},
         None, ks.CONNECTION_ESTABLISHED, "SecretKeyNotFound"),
        ("badmech", {"net": {"sasl": {"enable": True, "user": {"secretKeyRef": {"name": "creds", "key": "user"}},
                                      "password": {"secretKeyRef": {"name": "creds", "key": "user"}},
                                      "type": {"secretKeyRef": {"name": "creds", "key": "mech"}}}}},
         None, ks.CONNECTION_ESTABLISHED, "InvalidSaslMechanism"),
    ]:
        if name == "nokey":
            s.env.core.create_namespaced_secret(s.ns, {"metadata": {"name": "creds"},
                                                       "stringData": {"user": "u", "mech": "GSSAPI"}})
        s.create(name, {"bootstrapServers": servers, "topics": [topic], "sink": sink, **spec}, labels)
        c = s.wait(name, kind, "False", reason)
        assert s.condition(name, "Ready")["status"] == "False", name
        assert "GSSAPI" not in c["message"], c  # a Secret's value is never in a message


def test_sasl_ssl_source_through_net_secrets(sources: Sources, http: Subscriber,
                                             tmp_path: Path) -> None:
    s = sources
    topic = s.topic(1)
    user = s.kafka.scram_user
    s.env.core.create_namespaced_secret(s.ns, {"metadata": {"name": "kafka-creds"}, "stringData": {
        "user": user.name, "password": user.password, "mechanism": "SCRAM-SHA-512",
        "ca.crt": s.kafka.ca_path.read_text()}})
    ref = lambda key: {"secretKeyRef": {"name": "kafka-creds", "key": key}}  # noqa: E731
    net = {"sasl": {"enable": True, "user": ref("user"), "password": ref("password"), "type": ref("mechanism")},
           "tls": {"enable": True, "caCert": ref("ca.crt")}}
    s.create("secure", {"bootstrapServers": [s.kafka.sasl_ssl_bootstrap_servers], "topics": [topic],
                        "initialOffset": "earliest", "net": net, "sink": {"uri": http.url("/secure")}})
    s.ready("secure")
    (tmp_path / "check").mkdir()
    mount, _ = s.mount("secure", tmp_path / "check")
    assert mount is not None
    assert (mount / "protocol").read_text() == "SASL_SSL"
    assert (mount / "sasl.mechanism").read_text() == "SCRAM-SHA-512"
    assert sorted(p.name for p in mount.iterdir()) == ["ca.crt", "password", "protocol", "sasl.mechanism", "user"]
    s.produce(topic, [b"over SASL_SSL"], sasl=True)
    s.run_dispatcher("secure", tmp_path)
    wait_for(lambda: len(http.at("/secure")) >= 1, 30, "the event through SASL_SSL")
    assert http.at("/secure")[0].body == b"over SASL_SSL"
    # The dispatcher mounts the system namespace's copy of exactly the named keys; the source's Secret stays where
    # its owner put it. A changed value Kafka accepts (the user has SCRAM-SHA-256 credentials too) reaches the copy
    # and rolls the pods; the copy goes with the source.
    copy = res.secret_copy_name(source_dispatcher_name(s.ns, "secure"))
    assert sorted(s.env.core.read_namespaced_secret(copy, s.env.system).data) == [
        "ca.crt", "password", "sasl.mechanism", "user"]
    checksum = s.deployment("secure").spec.template.metadata.annotations
    s.env.core.patch_namespaced_secret("kafka-creds", s.ns, {"stringData": {"mechanism": "SCRAM-SHA-256"}})
    eventually(lambda: base64.b64decode(s.env.core.read_namespaced_secret(copy, s.env.system).data["sasl.mechanism"])
               == b"SCRAM-SHA-256", 90, "the changed mechanism in the copy")
    eventually(lambda: s.deployment("secure").spec.template.metadata.annotations != checksum, 30, "pods rolled")
    s.delete("secure")
    eventually(lambda: gone(lambda: s.env.core.read_namespaced_secret(copy, s.env.system)), 60, "the copy deleted")

    # A wrong password: the connection is refused, said so, and the password is never in the message.
    s.env.core.create_namespaced_secret(s.ns, {"metadata": {"name": "wrong"}, "stringData": {
        "user": user.name, "password": "not-the-password-123", "mechanism": "SCRAM-SHA-512",
        "ca.crt": s.kafka.ca_path.read_text()}})
    wrong = {"secretKeyRef": {"name": "wrong", "key": "password"}}
    s.create("denied", {"bootstrapServers": [s.kafka.sasl_ssl_bootstrap_servers], "topics": [topic],
                        "net": {**net, "sasl": {**net["sasl"], "password": wrong}}, "sink": {"uri": http.url("/x")}})
    c = s.wait("denied", ks.CONNECTION_ESTABLISHED, "False", timeout=60)
    assert "not-the-password-123" not in str(s.get("denied")["status"])
    assert c["reason"] in ("TopicNotAuthorized", "KafkaUnreachable", "AuthenticationFailed"), c


def test_delete_removes_the_deployment_then_the_group_while_the_sink_hangs(
        sources: Sources, http: Subscriber, tmp_path: Path) -> None:
    s = sources
    topic = s.topic(2)
    # The sink holds the request until the test server stops: deletion must not wait for it (nor for the 120 s
    # delivery timeout).
    http.behaviours["/hang"] = lambda _r, _a: (200, {}, b"", math.inf)
    s.create("bye", {"bootstrapServers": [s.kafka.bootstrap_servers], "topics": [topic], "consumerGroup": "bye-grp",
                     "sink": {"uri": http.url("/hang")}, "delivery": {"timeout": "PT120S"}})
    s.ready("bye")
    s.run_dispatcher("bye", tmp_path)
    s.produce(topic, [b"stuck"])
    wait_for(lambda: len(http.at("/hang")) >= 1, 30, "the delivery hangs")
    assert s.group_exists("bye-grp")
    name = source_dispatcher_name(s.ns, "bye")
    s.delete("bye")
    # The source, its Deployment and its group are gone while the sink still holds the request.
    eventually(lambda: gone(lambda: s.get("bye")), 60, "the source gone while the sink holds its delivery")
    assert http.active == 1, "the sink was still answering"
    assert not s.group_exists("bye-grp")
    assert gone(lambda: s.env.apps.read_namespaced_deployment(name, s.env.system))


def _keda(s: Sources, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(s.custom.get_namespaced_custom_object(keda.GROUP, keda.VERSION, s.env.system, plural, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_keda_scales_an_annotated_source(keda_sources: Sources, keda_crds: Any) -> None:
    """KEDA does not run here (no metrics pipeline): the API server checks what the controller writes against
    KEDA's own CRD schemas, and the test plays KEDA's part on the Deployment's scale."""
    s = keda_sources
    topic, other = s.topic(3), s.topic(2)
    name = source_dispatcher_name(s.ns, "auto")
    annotations = {"autoscaling.knative.dev/class": "keda.autoscaling.knative.dev",
                   "autoscaling.knative.dev/minScale": "0", "autoscaling.knative.dev/maxScale": "8",
                   "keda.autoscaling.knative.dev/pollingInterval": "5",
                   "keda.autoscaling.knative.dev/cooldownPeriod": "60",
                   "keda.autoscaling.knative.dev/kafkaLagThreshold": "7",
                   "keda.autoscaling.knative.dev/kafkaActivationLagThreshold": "2"}
    s.create("auto", {"bootstrapServers": [s.kafka.bootstrap_servers], "topics": [topic, other], "consumers": 2,
                      "consumerGroup": "auto-grp", "initialOffset": "earliest", "sink": {"uri": "http://127.0.0.1:9/x"}},
             annotations=annotations)

    # KEDA's CRDs absent: refused with a reason, and the controller sets spec.consumers meanwhile.
    c = s.wait("auto", "DispatcherAutoscalerReady", "False", "KEDANotInstalled")
    assert "install KEDA" in c["message"]
    eventually(lambda: s.deployment("auto").spec.replicas == 2, what="controller-set replicas")
    s.env.make_available(name, replicas=2)
    s.wait("auto", "Ready", "True")
    assert s.deployment("auto").metadata.annotations[res.ANNOTATION_SCALER] == res.SCALER_CONTROLLER

    # KEDA installed later: picked up without a restart, accepted by the API server against KEDA's schema.
    keda_crds.install()
    c = s.wait("auto", "DispatcherAutoscalerReady", "True", "KEDAScaledObjectReady")
    assert "0-3 replicas" in c["message"], c  # max-scale 8 capped at the largest topic's 3 partitions
    so = eventually(lambda: _keda(s, keda.SCALED_OBJECTS, name), what="ScaledObject")
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"],
            spec["cooldownPeriod"]) == (0, 3, 5, 60)
    assert [(t["type"], t["metadata"]) for t in spec["triggers"]] == [
        ("kafka", {"bootstrapServers": s.kafka.bootstrap_servers, "consumerGroup": "auto-grp", "topic": t,
                   "lagThreshold": "7", "activationLagThreshold": "2", "offsetResetPolicy": "earliest",
                   "tls": "disable"}) for t in (topic, other)]
    assert so["metadata"]["annotations"][ANNOTATION_SOURCE] == f"{s.ns}/auto"
    assert _keda(s, keda.TRIGGER_AUTHENTICATIONS, name) is None  # PLAINTEXT: no credentials to hand over
    eventually(lambda: s.deployment("auto").metadata.annotations[res.ANNOTATION_SCALER] == res.SCALER_KEDA,
               what="Deployment marked as KEDA-scaled")
    bad = {**so, "metadata": {"name": "bad"}, "spec": {**spec, "maxReplicaCount": "three"}}
    with pytest.raises(ApiException) as info:  # the schema is really enforced
        s.custom.create_namespaced_custom_object(keda.GROUP, keda.VERSION, s.env.system, keda.SCALED_OBJECTS, bad)
    assert info.value.status == 422

    # KEDA scales to zero (min-scale 0) and back up: the controller leaves its count alone and reports it.
    s.env.apps.patch_namespaced_deployment_scale(name, s.env.system, {"spec": {"replicas": 0}})
    s.wait("auto", ks.DEPLOYED, "True", "ScaledToZero")
    eventually(lambda: s.get("auto")["status"]["consumers"] == 0, what="status.consumers 0")
    s.env.apps.patch_namespaced_deployment_scale(name, s.env.system, {"spec": {"replicas": 3}})
    s.env.make_available(name, replicas=3)
    eventually(lambda: s.get("auto")["status"]["consumers"] == 3, what="status.consumers follows KEDA")
    s.patch("auto", {"spec": {"consumers": 1}})  # a spec change reconciles, and still does not fight KEDA
    eventually(lambda: s.get("auto")["status"]["observedGeneration"] == s.get("auto")["metadata"]["generation"],
               what="spec change observed")
    assert s.deployment("auto").spec.replicas == 3
    s.wait("auto", "Ready", "True")

    # SASL_SSL through net Secrets of the source's namespace: a TriggerAuthentication naming the keys of their copy
    # beside it (KEDA reads Secrets of the ScaledObject's namespace), the mode in the metadata.
    user = s.kafka.scram_user
    s.env.core.create_namespaced_secret(s.ns, {"metadata": {"name": "keda-creds"}, "stringData": {
        "u": user.name, "p": user.password, "m": "SCRAM-SHA-512", "ca": s.kafka.ca_path.read_text()}})
    ref = lambda key: {"secretKeyRef": {"name": "keda-creds", "key": key}}  # noqa: E731
    s.patch("auto", {"spec": {"bootstrapServers": [s.kafka.sasl_ssl_bootstrap_servers], "net": {
        "sasl": {"enable": True, "user": ref("u"), "password": ref("p"), "type": ref("m")},
        "tls": {"enable": True, "caCert": ref("ca")}}}})
    ta = eventually(lambda: _keda(s, keda.TRIGGER_AUTHENTICATIONS, name), what="TriggerAuthentication")
    copy = res.secret_copy_name(name)
    assert ta["spec"]["secretTargetRef"] == [{"parameter": "username", "name": copy, "key": "user"},
                                             {"parameter": "password", "name": copy, "key": "password"},
                                             {"parameter": "ca", "name": copy, "key": "ca.crt"}]
    so = eventually(lambda: (o := _keda(s, keda.SCALED_OBJECTS, name)) and o["spec"]["triggers"][0][
        "metadata"].get("sasl") and o, what="SASL triggers")
    for t in so["spec"]["triggers"]:
        assert t["authenticationRef"] == {"name": name}
        assert (t["metadata"]["sasl"], t["metadata"]["tls"]) == ("scram_sha512", "enable")
        assert t["metadata"]["bootstrapServers"] == s.kafka.sasl_ssl_bootstrap_servers
    s.wait("auto", ks.CONNECTION_ESTABLISHED, "True")  # the same Secret keys really reach Kafka
    assert user.password not in str(ta) + str(so)  # referenced by key, never a value

    # A value that cannot be honoured: a condition naming it, Ready False; KEDA's objects stay as they were.
    s.patch("auto", {"metadata": {"annotations": {"autoscaling.knative.dev/maxScale": "many"}}})
    c = s.wait("auto", "DispatcherAutoscalerReady", "False", "InvalidAutoscaling")
    assert "autoscaling.knative.dev/maxScale" in c["message"]
    assert s.condition("auto", "Ready")["reason"] == "InvalidAutoscaling"

    # The annotations removed: both objects go and the controller owns replicas again (spec.consumers 1).
    s.patch("auto", {"metadata": {"annotations": {k: None for k in annotations}}})
    eventually(lambda: _keda(s, keda.SCALED_OBJECTS, name) is None
               and _keda(s, keda.TRIGGER_AUTHENTICATIONS, name) is None, what="KEDA objects gone")
    eventually(lambda: s.deployment("auto").spec.replicas == 1, what="replicas back to spec.consumers")
    eventually(lambda: s.condition("auto", "DispatcherAutoscalerReady") is None, what="condition dropped")
    assert s.deployment("auto").metadata.annotations[res.ANNOTATION_SCALER] == res.SCALER_CONTROLLER

    # Annotated again, then deleted: what KEDA got goes with the source.
    s.patch("auto", {"metadata": {"annotations": annotations}})
    eventually(lambda: _keda(s, keda.SCALED_OBJECTS, name), what="ScaledObject back")
    s.delete("auto")
    eventually(lambda: gone(lambda: s.get("auto")), 30, "the source gone")
    assert _keda(s, keda.SCALED_OBJECTS, name) is None and _keda(s, keda.TRIGGER_AUTHENTICATIONS, name) is None


def test_the_dispatcher_process_runs_as_the_deployment_says(sources: Sources, http: Subscriber,
                                                            kube_control_plane: KubeControlPlane,
                                                            tmp_path: Path) -> None:
    """``python -m kafka_eventing.dispatcher`` with exactly the environment of the source's Deployment (plus the
    kubeconfig a pod gets from its ServiceAccount, and a free metrics port): it answers its liveness probe and
    delivers. (Its start once asked the API about ResetOffsets through a client it never made, so the pod
    crash-looped; only the cluster tiers ran it this way.)"""
    s = sources
    topic = s.topic(1)
    s.create("proc", {"bootstrapServers": [s.kafka.bootstrap_servers], "topics": [topic],
                      "initialOffset": "earliest", "sink": {"uri": http.url("/proc")}})
    s.ready("proc")
    container = s.deployment("proc").spec.template.spec.containers[0]
    port = free_port()
    variables = {**{k: v for k, v in os.environ.items() if not k.startswith("KE_")},
                 **{e.name: e.value or "" for e in container.env}, "KE_METRICS_PORT": str(port),
                 "KE_KUBECONFIG": str(kube_control_plane.kubeconfig),
                 "KE_KAFKA_EXTRA": "session.timeout.ms=6000,heartbeat.interval.ms=500"}
    assert variables["KE_CHANNEL_SOURCE"] == "kube" and variables["KE_SOURCE_NAME"] == "proc"
    s.produce(topic, [b"from the process"])
    with (tmp_path / "dispatcher.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                                env=variables, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def alive() -> bool:
            assert proc.poll() is None, (tmp_path / "dispatcher.log").read_text()[-3000:]
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                                                      timeout=2) as r:
                return r.status == 200
            return False

        wait_for(alive, 60, "the liveness probe's answer")
        wait_for(lambda: len(http.at("/proc")) >= 1, 60, "the event through the dispatcher process")
        assert http.at("/proc")[0].body == b"from the process"
        assert http.at("/proc")[0].headers["ce-type"] == ks.EVENT_TYPE
        assert proc.poll() is None
    finally:
        terminate(proc, timeout=30)  # type: ignore[arg-type]
