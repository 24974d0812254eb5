"""Brokers and Triggers on the real API server: ``Brokers`` creates them and waits on their conditions; the
``brokers`` fixture gives one with a controller started by ``start``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from fixtures.kube import gone
from kafka_eventing.controller.brokers import broker_dispatcher_name
from kafka_eventing.controller.crd import BROKER_CRDS, install_crd
from kafka_eventing.controller.main import api_client
from kafka_eventing.core import brokers as kb
from kafka_eventing.dispatcher.status import REASON_JOINED, KubeTriggerStatusWriter, SubscriberStatus
from kafka_eventing.localstack.kube import KubeControlPlane
from support.controller import RECEIVER, Env, eventually

MERGE = "application/merge-patch+json"


class Brokers:
    """Broker/Trigger helpers over the channel tests' ``Env``."""

    def __init__(self, environment: Env) -> None:
        self.env, self.ns, self.custom = environment, environment.namespace, environment.custom

    def create(self, plural: str, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> None:
        kind = "Broker" if plural == kb.BROKERS else "Trigger"
        body = {"apiVersion": f"{kb.GROUP}/{kb.VERSION}", "kind": kind,
                "metadata": {"name": name, "namespace": self.ns, "annotations": annotations or {}}, "spec": spec}
        self.custom.create_namespaced_custom_object(kb.GROUP, kb.VERSION, self.ns, plural, body)

    def broker(self, name: str, spec: dict[str, Any] | None = None, **annotations: str) -> None:
        self.create(kb.BROKERS, name, spec or {}, {kb.ANNOTATION_BROKER_CLASS: kb.BROKER_CLASS, **annotations})

    def trigger(self, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> None:
        self.create(kb.TRIGGERS, name, spec, annotations)

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(kb.GROUP, kb.VERSION, self.ns, plural, name))

    def patch(self, plural: str, name: str, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(kb.GROUP, kb.VERSION, self.ns, plural, name, body,
                                                   _content_type=MERGE)

    def delete(self, plural: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(kb.GROUP, kb.VERSION, self.ns, plural, name)

    def gone(self, plural: str, name: str) -> bool:
        return gone(lambda: self.get(plural, name))

    def condition(self, plural: str, name: str, kind: str) -> dict[str, Any] | None:
        for c in (self.get(plural, name).get("status") or {}).get("conditions") or ():
            if c["type"] == kind:
                return dict(c)
        return None

    def wait(self, plural: str, name: str, kind: str, status: str, reason: str | None = None,
             timeout: float = 40) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            c = self.condition(plural, name, kind)
            ok = c is not None and c["status"] == status and (reason is None or c.get("reason") == reason)
            return c if ok else None

        return eventually(check, timeout, f"{plural} {name} {kind}={status} {reason or ''}")

    def group_joined(self, name: str) -> None:
        """Report the Trigger's consumer group joined, as the Broker's dispatcher does (with its writer): these
        tests run the controller alone, the way they play the kubelet for Deployments."""
        generation = int(self.get(kb.TRIGGERS, name)["metadata"]["generation"])
        KubeTriggerStatusWriter(self.env.api).write(
            (self.ns, kb.trigger_broker(self.get(kb.TRIGGERS, name))),
            [SubscriberStatus(name, generation, True, "", REASON_JOINED)])

    def ready_trigger(self, name: str) -> dict[str, Any]:
        """Wait for the controller's conditions, report the group joined, then wait for Ready."""
        for kind in (*kb.DISPATCH_GATES, kb.SUBSCRIPTION_READY):
            self.wait(kb.TRIGGERS, name, kind, "True")
        self.group_joined(name)
        return self.wait(kb.TRIGGERS, name, "Ready", "True")

    def service(self, name: str) -> None:
        self.env.core.create_namespaced_service(self.ns, {"metadata": {"name": name},
                                                          "spec": {"ports": [{"port": 80}]}})

    def ready_broker(self, name: str, spec: dict[str, Any] | None = None) -> None:
        """A Broker made Ready: the controller creates its dispatcher; the 'kubelet' reports it available."""
        self.broker(name, spec)
        dispatcher = broker_dispatcher_name(self.ns, name)
        eventually(lambda: self.env.apps.read_namespaced_deployment(dispatcher, self.env.system),
                   what="broker dispatcher Deployment")
        self.env.make_available(dispatcher)
        self.env.make_available(RECEIVER)
        self.wait(kb.BROKERS, name, "Ready", "True")


@pytest.fixture
def brokers(env: Env) -> Iterator[Brokers]:
    b = Brokers(env)
    try:
        yield b
    finally:
        for ctl in env.controllers:
            ctl.stop()
        env.controllers.clear()
        # Brokers and Triggers keep their finalizer once the controller is gone: strip it so the namespace can go.
        for plural in (kb.BROKERS, kb.TRIGGERS):
            for item in env.custom.list_namespaced_custom_object(kb.GROUP, kb.VERSION, b.ns, plural)["items"]:
                with contextlib.suppress(ApiException):
                    b.patch(plural, item["metadata"]["name"], {"metadata": {"finalizers": []}})


def start(environment: Env, **settings: Any) -> None:
    environment.start_controller(environment.settings(**settings), brokers=True)




@pytest.fixture(scope="module")
def api(kube_control_plane: KubeControlPlane) -> Iterator[client.ApiClient]:
    c = api_client(kube_control_plane.kubeconfig)
    install_crd(c)
    for file in BROKER_CRDS:
        install_crd(c, file=file)
    yield c
    c.close()
