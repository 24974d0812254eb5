"""A control-plane environment: the real API server with the CRDs installed (``api``), a namespace, the system
namespace and Kafka (``Env``, fixture ``env``), the controller started fast (``FAST``), and what its tests read back
(a channel's dispatcher, how many reconciles). ``eventually`` is ``tests/waiting.py``'s ``wait_for`` with the API's
"not there yet" errors tolerated."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kubernetes import client
from kubernetes.client.rest import ApiException

from fixtures.kube import gone
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import SECRET_LABEL
from kafka_eventing.controller.controller import Controller, ControllerOptions
from kafka_eventing.controller.crd import install_crd
from kafka_eventing.controller.registry import KINDS
from kafka_eventing.core.kube import api_client
from kafka_eventing.core.settings import Settings
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane
from waiting import NotYet, wait_for

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


def settle(ctl: Controller, quiet: float = 1.0, timeout: float = 30) -> None:
    """Wait until the controller has nothing left to do — no key queued, no reconcile for ``quiet`` seconds (the
    echoes of its own writes are done) — so that what it does next is a reaction to what the test does next."""
    def total() -> float:
        return sum(ctl.metrics.registry.get_sample_value("kafkachannel_reconcile_total", {"result": r}) or 0.0
                   for r in ("success", "error"))

    seen = [total(), time.monotonic()]

    def quiet_now() -> bool:
        count = total()
        if count != seen[0] or len(ctl.queue):
            seen[:] = [count, time.monotonic()]
            return False
        return time.monotonic() - seen[1] >= quiet

    wait_for(quiet_now, timeout, "the controller idle", interval=0.1)
