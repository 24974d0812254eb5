"""The controller against a real kube-apiserver (+ controller-manager) and a real Kafka broker.

The control plane has no nodes, so dispatcher Pods stay Pending. Availability is driven the way a kubelet
would report it: the test marks the Pods that the real ReplicaSet controller created as Running and Ready
(``mark_pods_ready``); the Deployment controller then reports the Deployment available by itself.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kubernetes import client
from kubernetes.client.rest import ApiException

from fixtures.kube import gone
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.channels import FINALIZER
from kafka_eventing.controller.connection import SECRET_LABEL
from kafka_eventing.controller.controller import Controller, ControllerOptions
from kafka_eventing.controller.crd import install_crd
from kafka_eventing.controller.registry import KINDS
from kafka_eventing.core.channels import ANNOTATION_EXTERNAL_TOPIC
from kafka_eventing.core.kube import api_client
from kafka_eventing.core.settings import Settings
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane
from promtool import assert_promtool_passes
from waiting import NotYet, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.kafka]

GROUP, VERSION, PLURAL = "messaging.knative.dev", "v1beta1", "kafkachannels"
RECEIVER = "kafka-channel-receiver"
#: A finalizer of the tests' own: a pod holding it stays, terminating, as one whose process has not exited yet.
HOLD = "kafka-eventing.test/hold"
T = TypeVar("T")

FAST = ControllerOptions(workers=2, resync_seconds=2, topic_recheck_seconds=1, watch_timeout_seconds=30,
                         lease_duration=4, renew_deadline=3, retry_period=0.5, kafka_timeout=3, base_backoff=0.2,
                         max_backoff=2)


def eventually(check: Callable[[], T | None], timeout: float = 30, what: str = "condition") -> T:
    # The objects under test appear and fill in over time: a missing one or field is "not yet".
    return wait_for(check, timeout, what, interval=0.2,  # type: ignore[return-value]
                    tolerate=(ApiException, KeyError, IndexError, TypeError))


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api(kube_control_plane: KubeControlPlane) -> Iterator[client.ApiClient]:
    c = api_client(kube_control_plane.kubeconfig)
    install_crd(c)
    yield c
    c.close()


class Env:
    def __init__(self, api: client.ApiClient, kafka: KafkaNode, namespace: str, system: str) -> None:
        self.api, self.kafka, self.namespace, self.system = api, kafka, namespace, system
        self.core, self.apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.admin = AdminClient({**kafka.client_config(), "log_level": 2})
        self.controllers: list[Controller] = []

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {"system_namespace": self.system, "bootstrap_servers": "unused:1",
                                  "dispatcher_replicas": 4, "receiver_service": RECEIVER, **overrides}
        return Settings(**values)

    def start_controller(self, settings: Settings | None = None, **options: Any) -> Controller:
        """``options``: ControllerOptions fields, or a kind's option (``brokers=True``) to force it on or off."""
        kinds = {k.option: options.pop(k.option) for k in KINDS if k.option in options}
        opts = ControllerOptions(**{**FAST.__dict__, "identity": f"c-{uuid.uuid4().hex[:6]}", "kinds": kinds,
                                    **options})
        ctl = Controller(self.api, settings or self.settings(), opts)
        ctl.start()
        self.controllers.append(ctl)
        return ctl

    # channels
    def create(self, name: str, spec: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaChannel",
                "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations or {}},
                "spec": spec or {}}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name))

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec},
                                                   _content_type="application/merge-patch+json")

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        for c in (self.get(name).get("status") or {}).get("conditions") or ():
            if c["type"] == kind:
                return dict(c)
        return None

    def wait_condition(self, name: str, kind: str, status: str, timeout: float = 40) -> dict[str, Any]:
        return eventually(lambda: (c := self.condition(name, kind)) and c["status"] == status and c,
                          timeout, f"{name} {kind}={status}")

    def gone(self, name: str) -> bool:
        return gone(lambda: self.get(name))

    # Kafka
    def topic(self, name: str) -> tuple[int, int] | None:
        """(partitions, retention.ms) of a topic, None when it does not exist."""
        resource = ConfigResource(ResourceType.TOPIC, name)
        try:
            desc = self.admin.describe_topics(TopicCollection([name]))[name].result(timeout=10)
            # The topic may go between the two calls (a deletion in progress): then it does not exist either.
            configs = self.admin.describe_configs([resource])[resource].result(timeout=10)
        except KafkaException:
            return None
        return len(desc.partitions), int(configs["retention.ms"].value)

    # availability, as a kubelet would report it
    def mark_pods_ready(self, deployment: str, namespace: str | None = None) -> int:
        """``namespace``: the Deployment's, the system namespace unless given."""
        namespace = namespace or self.system
        dep = self.apps.read_namespaced_deployment(deployment, namespace)
        selector = ",".join(f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        marked = 0
        for pod in self.core.list_namespaced_pod(namespace, label_selector=selector).items:
            if any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or ())):
                marked += 1
                continue
            status = {"phase": "Running", "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
            self.core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": status})
            marked += 1
        return marked

    def hold_pods(self, deployment: str, timeout: float = 60) -> list[str]:
        """Put a finalizer on every pod of ``deployment``, as a kubelet keeps a terminating pod until its process
        exits; the held pods' names. Taken once the rollout has settled and checked on the live pods: a pod that the
        ReplicaSet controller replaced between a listing and the patch would be gone (404) or leave a successor
        without the finalizer."""
        def held() -> list[str]:
            dep = self.apps.read_namespaced_deployment(deployment, self.system)
            want, status = dep.spec.replicas or 0, dep.status
            if (status.observed_generation or 0) < dep.metadata.generation or (status.updated_replicas or 0) != want \
                    or (status.replicas or 0) != want:
                raise NotYet(f"rollout of {deployment} under way: generation {dep.metadata.generation}, {status}")
            selector = ",".join(f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())
            pods = [p for p in self.core.list_namespaced_pod(self.system, label_selector=selector).items
                    if p.metadata.deletion_timestamp is None]
            for pod in pods:
                if HOLD not in (pod.metadata.finalizers or ()):  # a pod replaced meanwhile: 404, not yet
                    self.core.patch_namespaced_pod(pod.metadata.name, self.system,
                                                   {"metadata": {"finalizers": [HOLD]}})
            names = sorted(p.metadata.name for p in pods)
            if len(names) != want:
                raise NotYet(f"{len(names)} live pods of {deployment} for {want} replicas: {names}")
            return names

        return eventually(held, timeout, f"every pod of {deployment} held by {HOLD}")

    def release_pods(self, pods: list[str]) -> None:
        for pod in pods:
            self.core.patch_namespaced_pod(pod, self.system, {"metadata": {"finalizers": None}})

    def make_available(self, deployment: str, replicas: int = 1, timeout: float = 40,
                       namespace: str | None = None) -> None:
        def available() -> bool:
            self.mark_pods_ready(deployment, namespace)
            dep = self.apps.read_namespaced_deployment(deployment, namespace or self.system)
            return (dep.status.available_replicas or 0) >= replicas

        eventually(available, timeout, f"Deployment {deployment} available")


@pytest.fixture
def env(api: client.ApiClient, kafka_running: KafkaNode, kube_namespace: str) -> Iterator[Env]:
    system = f"sys-{uuid.uuid4().hex[:8]}"
    e = Env(api, kafka_running, kube_namespace, system)
    e.core.create_namespace({"metadata": {"name": system}})
    # What the chart installs beside the controller: the dispatchers' ServiceAccount.
    e.core.create_namespaced_service_account(system, {"metadata": {"name": res.DISPATCHER_SERVICE_ACCOUNT}})
    secret = {"metadata": {"name": "kafka-connection", "labels": {SECRET_LABEL: "true"}},
              "stringData": kafka_running.connection_secret()}
    e.core.create_namespaced_secret(system, secret)
    receiver = res.labels("receiver")
    e.apps.create_namespaced_deployment(system, {
        "metadata": {"name": RECEIVER}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": RECEIVER}},
            "template": {"metadata": {"labels": {"app": RECEIVER, **receiver}},
                         "spec": {"containers": [{"name": "receiver", "image": "receiver:test"}]}}}})
    try:
        yield e
    finally:
        for ctl in e.controllers:
            ctl.stop()
        # Channels keep their finalizer once the controller is gone: strip it so the namespace can go.
        for item in e.custom.list_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL)["items"]:
            try:
                e.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, kube_namespace, PLURAL, item["metadata"]["name"], {"metadata": {"finalizers": []}},
                    _content_type="application/merge-patch+json")
            except ApiException:
                pass
        try:
            e.core.delete_namespace(system)
        except ApiException:
            pass


def reconciles(ctl: Controller) -> float:
    return ctl.metrics.registry.get_sample_value("kafkachannel_reconcile_total", {"result": "success"}) or 0.0


def dispatcher(env: Env, name: str) -> str:
    return res.dispatcher_name(env.namespace, name)


# -- tests ------------------------------------------------------------------------------------------
def test_schema_rejects_invalid_specs(env: Env) -> None:
    for i, bad in enumerate(({"numPartitions": 0}, {"replicationFactor": 0}, {"retentionDuration": "1 week"},
                             {"subscribers": [{"uid": "u", "deliveryOrder": "random"}]})):
        with pytest.raises(ApiException) as info:
            env.create(f"bad-{i}", bad)
        assert info.value.status == 422, bad
    env.create("defaults")
    spec = env.get("defaults")["spec"]
    assert (spec["numPartitions"], spec["replicationFactor"], spec["retentionDuration"]) == (1, 1, "PT168H")
    # The same object is served as v1.
    v1 = env.custom.get_namespaced_custom_object(GROUP, "v1", env.namespace, PLURAL, "defaults")
    assert v1["spec"] == spec


def test_channel_lifecycle(env: Env) -> None:
    env.core.create_namespaced_service(env.namespace, {"metadata": {"name": "dls"},
                                                       "spec": {"ports": [{"port": 80}]}})
    env.start_controller()
    env.create("orders", {"numPartitions": 3, "retentionDuration": "PT1H",
                          "delivery": {"deadLetterSink": {"ref": {"apiVersion": "v1", "kind": "Service",
                                                                  "name": "dls"}, "uri": "/dead"}}})
    topic = f"{env.namespace}.orders"
    eventually(lambda: env.topic(topic) == (3, 3_600_000), what="topic with 3 partitions, 1h retention")
    env.wait_condition("orders", "TopicReady", "True")

    svc = eventually(lambda: env.core.read_namespaced_service("orders-kn-channel", env.namespace))
    assert svc.spec.type == "ExternalName"
    assert svc.spec.external_name == f"{RECEIVER}.{env.system}.svc.cluster.local"
    name = dispatcher(env, "orders")
    dep = eventually(lambda: env.apps.read_namespaced_deployment(name, env.system))
    assert dep.spec.replicas == 3  # min(dispatcher_replicas=4, partitions=3)
    container = dep.spec.template.spec.containers[0]
    env_vars = {e.name: e.value for e in container.env}
    assert env_vars["KE_CHANNEL_NAME"] == "orders" and env_vars["KE_CHANNEL_NAMESPACE"] == env.namespace
    assert container.security_context.read_only_root_filesystem and container.security_context.run_as_non_root
    assert dep.spec.template.spec.volumes[1].secret.secret_name == "kafka-connection"
    assert env.core.read_namespaced_service(name, env.system).spec.ports[0].name == "metrics"

    # Addressable at once, but not Ready until the dispatcher and the receiver are available.
    status = eventually(lambda: env.get("orders").get("status", {}).get("address"), what="address")
    assert status["url"] == f"http://orders-kn-channel.{env.namespace}.svc.cluster.local"
    got = env.get("orders")
    assert FINALIZER in got["metadata"]["finalizers"]
    assert got["status"]["deadLetterSinkUri"] == f"http://dls.{env.namespace}.svc.cluster.local/dead"
    assert env.wait_condition("orders", "Ready", "False")["reason"] in (
        "DispatcherDeploymentUnavailable", "ReceiverDeploymentUnavailable")
    env.make_available(name, replicas=3)
    env.make_available(RECEIVER)
    ready = env.wait_condition("orders", "Ready", "True")
    assert env.get("orders")["status"]["observedGeneration"] == env.get("orders")["metadata"]["generation"]

    # A dispatcher's status.subscribers survives the controller's status writes.
    env.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, env.namespace, PLURAL, "orders",
        {"status": {"subscribers": [{"uid": "s1", "ready": "True", "observedGeneration": 1}]}},
        _content_type="application/merge-patch+json")

    # Grow partitions and change retention: applied; the Deployment follows the partition count.
    env.patch_spec("orders", {"numPartitions": 5, "retentionDuration": "PT2H"})
    eventually(lambda: env.topic(topic) == (5, 7_200_000), what="topic grown to 5 partitions, 2h retention")
    eventually(lambda: env.apps.read_namespaced_deployment(name, env.system).spec.replicas == 4, what="replicas")
    # Shrink: refused with a reason, nothing changes.
    env.patch_spec("orders", {"numPartitions": 2})
    refused = env.wait_condition("orders", "TopicReady", "False")
    assert refused["reason"] == "PartitionsShrinkRefused" and "5 partitions" in refused["message"]
    assert env.topic(topic) == (5, 7_200_000)
    assert env.get("orders")["status"]["subscribers"][0]["uid"] == "s1"
    # Ready's lastTransitionTime moved only when Ready changed.
    assert env.condition("orders", "Ready")["lastTransitionTime"] >= ready["lastTransitionTime"]

    # A rotated connection Secret rolls the dispatcher's pod template.
    before = dep.spec.template.metadata.annotations[res.ANNOTATION_CONFIG_CHECKSUM]
    env.core.patch_namespaced_secret("kafka-connection", env.system, {"stringData": {"client.id": "rotated"}})
    eventually(lambda: env.apps.read_namespaced_deployment(name, env.system).spec.template.metadata.annotations[
        res.ANNOTATION_CONFIG_CHECKSUM] != before, what="checksum change")

    # Delete: topic, dispatcher and Services go, then the finalizer is removed.
    env.delete("orders")
    eventually(lambda: env.gone("orders"), what="channel deleted")
    assert env.topic(topic) is None
    for read, ns, obj in ((env.apps.read_namespaced_deployment, env.system, name),
                          (env.core.read_namespaced_service, env.system, name),
                          (env.core.read_namespaced_service, env.namespace, "orders-kn-channel")):
        with pytest.raises(ApiException) as info:
            read(obj, ns)
        assert info.value.status == 404


def test_topics_kept_external_and_already_gone(env: Env) -> None:
    env.start_controller(env.settings(delete_topics=False))
    # A topic managed outside (Event Hubs style): named by annotation, must exist, never altered or deleted.
    env.create("ext", {"numPartitions": 1}, {ANNOTATION_EXTERNAL_TOPIC: f"ext-{env.namespace}"})
    missing = env.wait_condition("ext", "TopicReady", "False")
    assert missing["reason"] == "TopicNotFound" and "does not exist" in missing["message"]
    env.admin.create_topics([NewTopic(f"ext-{env.namespace}", 2, 1)])[f"ext-{env.namespace}"].result(timeout=20)
    env.wait_condition("ext", "TopicReady", "True")
    assert env.topic(f"ext-{env.namespace}")[0] == 2  # not grown nor shrunk to numPartitions

    env.create("kept")
    eventually(lambda: env.topic(f"{env.namespace}.kept"), what="topic kept created")
    env.delete("kept")
    env.delete("ext")
    eventually(lambda: env.gone("kept") and env.gone("ext"), what="both channels deleted")
    assert env.topic(f"{env.namespace}.kept") is not None  # delete_topics=False
    assert env.topic(f"ext-{env.namespace}") is not None


def test_deleting_a_channel_whose_topic_is_gone(env: Env) -> None:
    env.start_controller()
    env.create("vanished")
    topic = f"{env.namespace}.vanished"
    eventually(lambda: env.topic(topic), what="topic created")
    env.admin.delete_topics([topic])[topic].result(timeout=20)
    eventually(lambda: env.topic(topic) is None, what="topic deleted by hand")
    env.delete("vanished")
    eventually(lambda: env.gone("vanished"), what="channel deleted")


def test_deleting_a_channel_stops_its_dispatcher_before_deleting_its_topic(env: Env) -> None:
    """While a dispatcher pod still exists (held here by a finalizer, as a kubelet keeps a terminating pod until
    its process exits) the channel's topic stays; once the Deployment is gone, pods and all, the topic goes."""
    env.start_controller()
    env.create("held")
    topic = f"{env.namespace}.held"
    eventually(lambda: env.topic(topic), what="topic created")
    dispatcher = res.dispatcher_name(env.namespace, "held")
    eventually(lambda: env.apps.read_namespaced_deployment(dispatcher, env.system), what="dispatcher")
    pods = env.hold_pods(dispatcher)

    env.delete("held")
    eventually(lambda: all(env.core.read_namespaced_pod(pod, env.system).metadata.deletion_timestamp
                           for pod in pods), what="the dispatcher pods terminating")
    # Many reconciles happen meanwhile (the recheck is 2 s, each Deployment event one more): none may delete
    # the topic while a dispatcher pod could still be consuming it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert env.topic(topic) is not None, "the topic was deleted while the dispatcher pod still existed"
        time.sleep(0.2)
    assert not env.gone("held")

    env.release_pods(pods)
    eventually(lambda: gone(lambda: env.apps.read_namespaced_deployment(dispatcher, env.system)),
               what="the dispatcher Deployment gone")
    eventually(lambda: env.topic(topic) is None, what="the topic deleted after the dispatcher")
    eventually(lambda: env.gone("held"), what="the channel deleted")


def test_deleting_a_channel_deletes_its_subscribers_consumer_groups(env: Env) -> None:
    from confluent_kafka import Consumer, TopicPartition

    # The topic stays (delete_topics=False): Kafka itself drops the offsets, and so the empty groups, of a deleted
    # topic, which would hide a group the controller left behind.
    env.start_controller(env.settings(delete_topics=False))
    subscribers = [{"uid": uid, "generation": 1, "subscriberUri": f"http://{uid}.example/"} for uid in ("a", "b")]
    env.create("grouped", {"subscribers": subscribers})
    topic = f"{env.namespace}.grouped"
    eventually(lambda: env.topic(topic), what="topic created")
    groups = {f"kafka.{env.namespace}.grouped.{uid}" for uid in ("a", "b")}
    for group in groups:  # what a dispatcher leaves: committed offsets, no members
        consumer = Consumer({**env.kafka.client_config(), "group.id": group, "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        consumer.close()

    def listed() -> set[str]:
        return {g.group_id for g in env.admin.list_consumer_groups().result(10).valid}

    assert groups <= listed()
    env.delete("grouped")
    eventually(lambda: env.gone("grouped"), what="channel deleted")
    assert not groups & listed(), "a deleted channel's consumer groups were left behind"


def test_kafka_outage_is_reported_and_recovered(env: Env) -> None:
    env.start_controller()
    env.kafka.stop()
    try:
        env.create("outage", {"numPartitions": 2})
        down = env.wait_condition("outage", "TopicReady", "False", timeout=40)
        assert down["reason"] == "KafkaUnreachable", down
        assert env.kafka.bootstrap_servers in down["message"]
    finally:
        env.kafka.start()
    # Same controller, no restart: the requeue with backoff retries until Kafka answers.
    env.wait_condition("outage", "TopicReady", "True", timeout=60)
    assert env.topic(f"{env.namespace}.outage") == (2, 168 * 3_600_000)


def test_only_the_lease_holder_writes_and_a_restart_converges(env: Env) -> None:
    first = env.start_controller(health_port=0, health_address="127.0.0.1")
    eventually(lambda: first.elector.is_leader, what="first controller leads")
    base = f"http://127.0.0.1:{first.health_port}"
    assert urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok"
    second = env.start_controller()
    eventually(second.synced, what="second controller synced")
    names = [f"c{i}" for i in range(3)]
    for n in names:
        env.create(n, {"numPartitions": 2})
    eventually(lambda: all(env.condition(n, "TopicReady") for n in names), what="channels reconciled")
    assert not second.elector.is_leader
    assert reconciles(second) == 0
    assert reconciles(first) > 0
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    assert "kafkachannel_reconcile_duration_seconds_count" in metrics
    assert "kafkachannel_controller_leader 1.0" in metrics
    assert_promtool_passes(metrics, "the leading controller's /metrics")

    # Stop the leader mid-way (a new channel pending); the standby takes over and converges.
    first.stop()
    env.controllers.remove(first)
    env.create("late", {"numPartitions": 2})
    eventually(lambda: second.elector.is_leader, timeout=20, what="second controller leads")
    eventually(lambda: env.condition("late", "TopicReady"), what="late channel reconciled by the new leader")
    # A restarted controller (fresh caches) converges without duplicates.
    third = env.start_controller()
    second.stop()
    env.controllers.remove(second)
    eventually(lambda: third.elector.is_leader, timeout=20, what="third controller leads")
    for n in [*names, "late"]:
        env.make_available(dispatcher(env, n), replicas=2)
    env.make_available(RECEIVER)
    for n in [*names, "late"]:
        env.wait_condition(n, "Ready", "True")
    selector = f"{res.LABEL_MANAGED_BY}={res.MANAGED_BY},{res.LABEL_COMPONENT}=dispatcher"
    # Controllers watch every namespace, so leftovers of earlier tests may have dispatchers here (a Broker's or a
    # KafkaSource's too, without a channel annotation): count ours.
    def ours(items: list[Any]) -> list[str]:
        return sorted(i.metadata.name for i in items
                      if (i.metadata.annotations or {}).get(res.ANNOTATION_CHANNEL, "").startswith(f"{env.namespace}/"))

    expected = sorted(dispatcher(env, n) for n in [*names, "late"])
    assert ours(env.apps.list_namespaced_deployment(env.system, label_selector=selector).items) == expected
    assert ours(env.core.list_namespaced_service(env.system, label_selector=selector).items) == expected
    assert len(env.core.list_namespaced_service(env.namespace).items) == 4
    lease = client.CoordinationV1Api(env.api).read_namespaced_lease("kafka-channel-controller", env.system)
    assert lease.spec.holder_identity == third.identity


def test_with_ingress_auth_on_channels_publish_their_audience(env: Env) -> None:
    issuer = "https://issuer.example"
    env.start_controller(env.settings(auth_issuer=issuer))
    env.create("secured")
    address = eventually(lambda: env.get("secured").get("status", {}).get("address"), what="address")
    assert address["audience"] == f"messaging.knative.dev/kafkachannel/{env.namespace}/secured"
    # Its dispatcher knows auth is on (a Broker's replies into the ingress carry a token then).
    dep = eventually(lambda: env.apps.read_namespaced_deployment(dispatcher(env, "secured"), env.system))
    assert {v.name: v.value for v in dep.spec.template.spec.containers[0].env}["KE_AUTH_ISSUER"] == issuer


def test_with_ingress_auth_off_no_audience_is_published(env: Env) -> None:
    env.start_controller()
    env.create("open")
    address = eventually(lambda: env.get("open").get("status", {}).get("address"), what="address")
    assert "audience" not in address
    dep = eventually(lambda: env.apps.read_namespaced_deployment(dispatcher(env, "open"), env.system))
    assert "KE_AUTH_ISSUER" not in {v.name for v in dep.spec.template.spec.containers[0].env}
